"""File operations done from the host with a sandbox user's rights, so that
the host's kernel refuses exactly what the sandbox's kernel would.

A function runs in a thread of its own whose filesystem credentials are the
user's: fsuid, fsgid, no supplementary groups and an empty effective
capability set. Linux keeps credentials per thread; only glibc's wrappers
(and so os.setgroups) broadcast a change to every thread of the process, so
the raw system calls are used here and no other thread is touched. Changing
the fsuid away from 0 already drops CAP_DAC_OVERRIDE, CAP_FOWNER, CAP_CHOWN
and the rest of the file capabilities from the effective set; emptying it
drops the others that bend file rules too (CAP_SYS_RESOURCE would let a
write past the workspace's reserved blocks). What the thread creates is the
user's with no chown at all.

The thread is started for the call and ends with it, so a thread whose
credentials could not be put back is never used again; they are put back
anyway, in ``finally``, and checked.
"""

from __future__ import annotations

import ctypes
import os
import platform
import threading
from collections.abc import Callable
from typing import TypeVar, cast

from sandboxd.errors import BackendError

T = TypeVar("T")

_NUMBERS = {
    "x86_64": {
        "setfsuid": 122,
        "setfsgid": 123,
        "getgroups": 115,
        "setgroups": 116,
        "capget": 125,
        "capset": 126,
    },
    "aarch64": {
        "setfsuid": 151,
        "setfsgid": 152,
        "getgroups": 158,
        "setgroups": 159,
        "capget": 90,
        "capset": 91,
    },
}
_CAP_VERSION_3 = 0x20080522
# setfsuid/setfsgid with an id that maps to nothing change nothing and
# answer the current one.
_QUERY = 0xFFFFFFFF
_MAX_GROUPS = 65536


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [
        ("effective", ctypes.c_uint32),
        ("permitted", ctypes.c_uint32),
        ("inheritable", ctypes.c_uint32),
    ]


_Caps = _CapData * 2


class CredentialsError(BackendError):
    """A thread's credentials could not be set or put back."""


def available() -> bool:
    """Whether this process can give a thread another user's file rights
    (Linux on a known architecture, running as root)."""
    return platform.system() == "Linux" and platform.machine() in _NUMBERS and os.geteuid() == 0


def run_as(uid: int, gid: int, fn: Callable[..., T], *args: object) -> T:
    """``fn(*args)`` in a fresh thread with ``uid``/``gid``'s file rights
    (see the module docstring); its result, or what it raised."""
    if not available():
        raise CredentialsError("this process cannot take a sandbox user's file rights (not root on Linux)")
    outcome: list[tuple[bool, object]] = []

    def body() -> None:
        try:
            outcome.append((True, _call_as(uid, gid, fn, args)))
        except BaseException as e:  # handed to the caller's thread
            outcome.append((False, e))

    thread = threading.Thread(target=body, name=f"fs-as-{uid}", daemon=True)
    thread.start()
    thread.join()
    ok, value = outcome[0]
    if not ok:
        raise cast(BaseException, value)
    return cast(T, value)


def _call_as(uid: int, gid: int, fn: Callable[..., T], args: tuple[object, ...]) -> T:
    sys = _Sys()
    saved_caps = sys.capget()
    saved_groups = sys.getgroups()
    saved_fsuid, saved_fsgid = sys.fsuid(_QUERY), sys.fsgid(_QUERY)
    try:
        sys.setgroups(())
        sys.set_fsgid(gid)
        sys.set_fsuid(uid)
        dropped = _Caps()
        for i in range(2):
            dropped[i].permitted = saved_caps[i].permitted
            dropped[i].inheritable = saved_caps[i].inheritable
        sys.capset(dropped)
        if any(c.effective for c in sys.capget()):
            raise CredentialsError("capabilities still effective after dropping them")
        return fn(*args)
    finally:
        # The effective set first: setgroups needs CAP_SETGID back.
        sys.capset(saved_caps)
        sys.set_fsuid(saved_fsuid)
        sys.set_fsgid(saved_fsgid)
        sys.setgroups(saved_groups)
        now = sys.capget()
        if any(now[i].effective != saved_caps[i].effective for i in range(2)):
            raise CredentialsError("capabilities not restored")


class _Sys:
    """The raw system calls, for the calling thread only."""

    def __init__(self) -> None:
        self._libc = ctypes.CDLL(None, use_errno=True)
        self._nr = _NUMBERS[platform.machine()]

    def _call(self, name: str, *args: object) -> int:
        ret = int(self._libc.syscall(ctypes.c_long(self._nr[name]), *args))
        if ret == -1 and name not in ("setfsuid", "setfsgid"):
            err = ctypes.get_errno()
            raise CredentialsError(f"{name}: {os.strerror(err)}")
        return ret

    def fsuid(self, uid: int) -> int:
        """setfsuid(uid): the fsuid before the call."""
        return self._call("setfsuid", ctypes.c_uint32(uid)) & 0xFFFFFFFF

    def fsgid(self, gid: int) -> int:
        return self._call("setfsgid", ctypes.c_uint32(gid)) & 0xFFFFFFFF

    def set_fsuid(self, uid: int) -> None:
        # setfsuid reports no error: the second call answers what the first did.
        self.fsuid(uid)
        if (now := self.fsuid(uid)) != uid:
            raise CredentialsError(f"setfsuid({uid}) left fsuid {now}")

    def set_fsgid(self, gid: int) -> None:
        self.fsgid(gid)
        if (now := self.fsgid(gid)) != gid:
            raise CredentialsError(f"setfsgid({gid}) left fsgid {now}")

    def getgroups(self) -> tuple[int, ...]:
        buf = (ctypes.c_uint32 * _MAX_GROUPS)()
        n = self._call("getgroups", ctypes.c_int(_MAX_GROUPS), buf)
        return tuple(buf[:n])

    def setgroups(self, groups: tuple[int, ...]) -> None:
        buf = (ctypes.c_uint32 * max(1, len(groups)))(*groups)
        self._call("setgroups", ctypes.c_size_t(len(groups)), buf)
        if (now := self.getgroups()) != groups:
            raise CredentialsError(f"setgroups{groups} left {now}")

    def capget(self) -> ctypes.Array[_CapData]:
        header = _CapHeader(_CAP_VERSION_3, 0)
        data = _Caps()
        self._call("capget", ctypes.byref(header), data)
        return data

    def capset(self, data: ctypes.Array[_CapData]) -> None:
        header = _CapHeader(_CAP_VERSION_3, 0)
        self._call("capset", ctypes.byref(header), data)
