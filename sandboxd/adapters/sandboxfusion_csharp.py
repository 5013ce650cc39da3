"""C# as SandboxFusion's ``dotnet run`` runs it, on Mono (no registry this
image is built from ships a current .NET SDK: Debian bookworm has none, and
npm's ``dotnet-*`` packages are .NET Core 2.x runtimes without a compiler).

Two differences would change a grade, and both are made up for here:

- A failed ``Debug.Assert`` ends a .NET program (``Process terminated.
  Assertion failed.`` on stderr, SIGABRT: exit 134), where Mono's default
  trace listener lets it go on and the program exits 0. MultiPL-E's C# tests
  are ``Debug.Assert`` calls, so under plain Mono every wrong answer that
  compiles passes. The program is compiled with DEBUG and TRACE defined (as
  ``dotnet run``'s Debug build is) and started through :data:`ENTRY`, which
  installs a listener that fails as .NET does, then calls the program's own
  ``Main``.
- ``dotnet new console`` projects have implicit usings (``System``,
  ``System.Linq``, ...): code without ``using System;`` compiles there.
  :func:`with_implicit_usings` adds them above the code, keeping its line
  numbers.
"""

from __future__ import annotations

__all__ = ["COMMAND", "ENTRY", "ENTRY_FILE", "IMPLICIT_USINGS", "with_implicit_usings"]

# The global usings of Microsoft.NET.Sdk for a console project (.NET 6 on).
IMPLICIT_USINGS: tuple[str, ...] = (
    "System",
    "System.Collections.Generic",
    "System.IO",
    "System.Linq",
    "System.Net.Http",
    "System.Threading",
    "System.Threading.Tasks",
)

ENTRY_FILE = "SandboxdEntry.cs"
# Compiler output goes to stderr: mcs reports every success with a summary
# line on stdout, which would change a program's stdout that a grader compares.
# CS0105 (a using given twice) is only the implicit usings meeting the code's own.
COMMAND = (
    "mcs -nologo -nowarn:105 -d:DEBUG -d:TRACE -r:System.Net.Http -main:SandboxdEntry"
    f" -out:main.exe Program.cs {ENTRY_FILE} >&2 && mono main.exe"
)

ENTRY = """\
using System;
using System.Diagnostics;
using System.Reflection;
using System.Runtime.ExceptionServices;

// A failed Debug.Assert or Trace.Assert ends the program as under .NET.
sealed class SandboxdAssertListener : DefaultTraceListener
{
    public override void Fail(string message, string detailMessage)
    {
        Console.Out.Flush();
        Console.Error.WriteLine("Process terminated. Assertion failed.");
        if (!string.IsNullOrEmpty(message)) Console.Error.WriteLine(message);
        if (!string.IsNullOrEmpty(detailMessage)) Console.Error.WriteLine(detailMessage);
        Console.Error.WriteLine(new StackTrace(true).ToString());
        Console.Error.Flush();
        Environment.Exit(134);
    }
}

static class SandboxdEntry
{
    static int Main(string[] args)
    {
        Trace.Listeners.Clear();
        Trace.Listeners.Add(new SandboxdAssertListener());
        MethodInfo main = null;
        foreach (Type t in typeof(SandboxdEntry).Assembly.GetTypes())
        {
            if (t == typeof(SandboxdEntry) || t == typeof(SandboxdAssertListener)) continue;
            foreach (MethodInfo m in t.GetMethods(BindingFlags.Static | BindingFlags.Public
                                                  | BindingFlags.NonPublic | BindingFlags.DeclaredOnly))
            {
                if (m.Name == "Main" && main == null) main = m;
            }
        }
        if (main == null)
        {
            Console.Error.WriteLine(
                "error CS5001: Program does not contain a static 'Main' method suitable for an entry point");
            return 1;
        }
        object result;
        try
        {
            result = main.Invoke(null, main.GetParameters().Length == 0 ? null : new object[] { args });
        }
        catch (TargetInvocationException e)
        {
            // The program's own exception, unhandled, with its own stack.
            ExceptionDispatchInfo.Capture(e.InnerException).Throw();
            throw;
        }
        Console.Out.Flush();
        return result is int code ? code : 0;
    }
}
"""


def _preamble_lines(lines: list[str]) -> int:
    """How many leading lines must stay first: ``#define``/``#undef`` come before
    any other token of a C# file (blank and comment-only lines may stand among them)."""
    keep = 0
    for i, line in enumerate(lines):
        text = line.strip()
        if text.startswith(("#define", "#undef")):
            keep = i + 1
        elif text and not text.startswith("//"):
            break
    return keep


def with_implicit_usings(code: str) -> str:
    """``code`` with the implicit usings above it, and a ``#line`` that keeps the
    compiler's line numbers those of the code as sent."""
    lines = code.splitlines(keepends=True)
    keep = _preamble_lines(lines)
    usings = "".join(f"using {name};\n" for name in IMPLICIT_USINGS)
    head = "".join(lines[:keep])
    if head and not head.endswith("\n"):
        head += "\n"
    return f"{head}{usings}#line {keep + 1}\n{''.join(lines[keep:])}"
