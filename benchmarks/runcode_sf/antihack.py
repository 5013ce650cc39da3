"""SandboxFusion's sandbox.utils.antihack (Apache-2.0): the code its anti-hack
tests expand before running it."""

from __future__ import annotations

PY_HEADER = """
# --- anti-hack code begin
import os
import sys
exit = None
os._exit = None
sys.exit = None
# --- anti-hack code end
"""

CPP_HEADER = """
// --- anti-hack code begin
#include <cstdlib>

void exit(int) {
    std::abort();
}
// --- anti-hack code end
"""


class APython:
    @staticmethod
    def expand_code(code: str) -> str:
        return f"{PY_HEADER}\n\n{code}"


class ACpp:
    @staticmethod
    def expand_code(code: str) -> str:
        return f"{CPP_HEADER}\n\n{code}"
