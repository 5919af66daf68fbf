"""Pure text work of the code task: the function a prompt asks for, the example calls in its
docstring, the program a completion makes, and the harness programs run in the sandbox.

Nothing here runs code: programs are only parsed (``ast``), never executed, in this process.
"""

from __future__ import annotations

import ast
import json
import re

_FENCE = re.compile(r"```[ \t]*(?:python3?|py)?[ \t]*\n(.*?)(?:\n```|\Z)", re.S | re.I)
_IO_LINE = re.compile(r"^\s*(?:For|Input:?)\s+(.+?)(?:,?\s+(?:the output|the result|Output:?).*)?$", re.I)
_TOP_LEVEL_OK = ("def ", "class ", "@", "import ", "from ", "#", "async def ")
OUTPUT_MARK = "<<corl-behaviour>>"
PASSED_MARK = "<<corl-tests-passed>>"


def entry_point(prompt: str) -> str | None:
    """The function the prompt asks for: its last top-level ``def`` (HumanEval's convention)."""
    try:
        tree = ast.parse(prompt)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None
    names = [n.name for n in tree.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)]
    return names[-1] if names else None


def _docstring(prompt: str, name: str) -> str:
    tree = ast.parse(prompt)
    fns = [n for n in tree.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef) and n.name == name]
    return (ast.get_docstring(fns[-1]) or "") if fns else ""


def _valid_call(expr: str, name: str) -> bool:
    try:
        node = ast.parse(expr, mode="eval").body
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return False
    return isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == name


def _calls_written_out(doc: str, name: str) -> list[str]:
    """``name(...)`` expressions written in the docstring (``>>> f(1)``, ``f(1) ==> 2``, ...)."""
    out = []
    for m in re.finditer(rf"\b{re.escape(name)}\s*\(", doc):
        i, depth = m.end(), 1
        while i < len(doc) and depth:
            depth += {"(": 1, ")": -1}.get(doc[i], 0)
            i += 1
        expr = doc[m.start() : i]
        if depth == 0 and _valid_call(expr, name):
            out.append(expr)
    return out


def _calls_from_io_lines(doc: str, name: str) -> list[str]:
    """``For lst = [1, 2] the output should be 3`` / ``Input: arr = [..], k = 4``: the values in order."""
    out = []
    for line in doc.splitlines():
        m = _IO_LINE.match(line)
        if not m:
            continue
        args = m.group(1).strip().rstrip(",. ")
        expr = f"{name}({args})"
        if not _valid_call(expr, name):
            continue
        call = ast.parse(expr, mode="eval").body
        assert isinstance(call, ast.Call)
        values = [*call.args, *(kw.value for kw in call.keywords)]  # ``x = 1, y = 2`` -> positional order
        out.append(f"{name}({', '.join(ast.unparse(v) for v in values)})")
    return out


def example_calls(prompt: str) -> list[str]:
    """Calls of the prompt's function taken from its own docstring examples, in order, deduplicated.

    These inputs, never a data set's hidden tests, define a program's behaviour for votes."""
    name = entry_point(prompt)
    if name is None:
        return []
    doc = _docstring(prompt, name)
    calls = _calls_written_out(doc, name) or _calls_from_io_lines(doc, name)
    return list(dict.fromkeys(calls))


def code_of(completion: str) -> str:
    """The code in a completion: the fenced block that defines a function (the last such), the first
    fenced block, or the whole completion when it has no fence (a plain continuation)."""
    blocks = _FENCE.findall(completion)
    if not blocks:
        return completion
    defining = [b for b in blocks if re.search(r"^\s*(?:async\s+)?def\s", b, re.M)]
    return defining[-1] if defining else blocks[0]


def _cut_continuation(body: str) -> str:
    """A continuation of the prompt's function ends at the first top-level statement that is not a
    definition or an import (test code, prints, an ``if __name__`` block)."""
    lines = body.split("\n")
    for i, line in enumerate(lines[1:], 1):
        if line.strip() and not line[0].isspace() and not line.startswith(_TOP_LEVEL_OK):
            return "\n".join(lines[:i])
    return body


def program(prompt: str, completion: str) -> str | None:
    """The program a completion makes for ``prompt``, or None when it is not valid Python that
    defines the prompt's function."""
    name = entry_point(prompt)
    if name is None:
        return None
    code = code_of(completion)
    if not code.strip():
        return None  # the prompt's stub alone is not an answer
    if re.search(rf"^(?:async\s+)?def\s+{re.escape(name)}\s*\(", code, re.M):
        src = f"{prompt.rstrip()}\n\n\n{_cut_continuation(code.strip(chr(10)))}\n"  # its definition replaces the stub
    else:
        src = prompt + _cut_continuation(code)
    try:
        tree = ast.parse(src)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None
    defined = any(isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef) and n.name == name for n in tree.body)
    return src if defined else None


def behaviour_harness(src: str, calls: list[str], nonce: str) -> str:
    """``src`` followed by code that prints the repr (or exception type) of each call as one JSON line."""
    return (
        f"{src}\n\n"
        "def __corl_run(calls):\n"
        "    import json\n"
        "    out = []\n"
        "    for c in calls:\n"
        "        try:\n"
        "            out.append(repr(eval(c)))\n"
        "        except BaseException as e:\n"
        "            out.append('!' + type(e).__name__)\n"
        f"    print({(OUTPUT_MARK + nonce)!r} + json.dumps(out))\n\n"
        f"__corl_run({json.dumps(calls)})\n"
    )


def read_behaviour(stdout: str, nonce: str) -> list[str] | None:
    mark = OUTPUT_MARK + nonce
    for line in reversed(stdout.splitlines()):
        if line.startswith(mark):
            try:
                out = json.loads(line[len(mark) :])
            except ValueError:
                return None
            return [str(x) for x in out] if isinstance(out, list) else None
    return None


def hidden_test_harness(src: str, test: str, name: str, nonce: str) -> str:
    """``src`` followed by the data set's hidden tests (HumanEval: ``check(candidate)``) and a line with
    ``nonce`` printed once they pass; evaluation only. A program that exits early (``os._exit(0)``,
    ``sys.exit(0)``) never prints it, so its exit status alone cannot pass it."""
    return f"{src}\n\n{test}\n\ncheck({name})\nprint({(PASSED_MARK + nonce)!r})\n"


def tests_passed(stdout: str, nonce: str) -> bool:
    return (PASSED_MARK + nonce) in stdout.splitlines()
