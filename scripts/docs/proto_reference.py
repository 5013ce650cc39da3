"""MkDocs hook: the gRPC API reference, generated from proto/sandboxd/v1 at build time.

Each ``.proto`` file becomes one page under ``reference/grpc/`` (plus an index
of every service and RPC): services with their RPCs, messages with their
fields, enums with their values, each under an anchor named by its full
protobuf name (``sandboxd.v1.SandboxService.Acquire``) and with the comment
written above it in the proto. The pages exist only in the build, never on
disk, so the reference cannot drift from the protos.

A service or RPC without a comment, or a field whose type resolves to nothing,
is logged as a warning, which the strict build turns into a failure.

The parser reads the subset of proto3 the protos use (services, rpcs with
streams, messages, nested messages, enums, oneofs, maps, optional and
repeated fields, options); it is not a general protobuf parser.
"""

from __future__ import annotations

import html
import logging
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

log = logging.getLogger("mkdocs.hooks.proto_reference")

PROTO_DIR = Path(__file__).resolve().parents[2] / "proto" / "sandboxd" / "v1"
OUT_DIR = "reference/grpc"

SCALARS = {
    "double", "float", "int32", "int64", "uint32", "uint64", "sint32", "sint64",
    "fixed32", "fixed64", "sfixed32", "sfixed64", "bool", "string", "bytes",
}  # fmt: skip
# Well-known types imported from google/protobuf: shown by name, not linked.
WELL_KNOWN = {"google.protobuf.Timestamp", "google.protobuf.Duration", "google.protobuf.Empty"}


@dataclass
class Field:
    """A message field (or an enum value, with ``type`` empty)."""

    name: str
    type: str
    number: str
    label: str  # "", "repeated", "optional", "map"
    doc: list[str]
    oneof: str = ""


@dataclass
class Rpc:
    """One RPC of a service."""

    name: str
    request: str
    request_stream: bool
    response: str
    response_stream: bool
    doc: list[str]


@dataclass
class Block:
    """A service, message, enum or oneof body being parsed."""

    kind: str  # "service", "message", "enum", "oneof"
    name: str  # dotted within the file for nested messages: "Parent.Child"
    doc: list[str]
    fields: list[Field] = field(default_factory=list)
    rpcs: list[Rpc] = field(default_factory=list)


@dataclass
class ProtoFile:
    """What one .proto file declares."""

    stem: str
    package: str
    doc: list[str]
    services: list[Block] = field(default_factory=list)
    messages: list[Block] = field(default_factory=list)
    enums: list[Block] = field(default_factory=list)


_RPC = re.compile(
    r"^rpc\s+(\w+)\s*\(\s*(stream\s+)?([\w.]+)\s*\)\s*returns\s*\(\s*(stream\s+)?([\w.]+)\s*\)\s*$"
)
_FIELD = re.compile(
    r"^(?:(repeated|optional)\s+)?([\w.]+|map\s*<\s*[\w.]+\s*,\s*[\w.]+\s*>)\s+(\w+)\s*=\s*(\d+)"
)
_ENUM_VALUE = re.compile(r"^(\w+)\s*=\s*(-?\d+)")


def _split_comment(line: str) -> tuple[str, str | None]:
    """Code and comment text of one line (protos here hold no '//' in strings)."""
    at = line.find("//")
    if at < 0:
        return line, None
    return line[:at], line[at + 2 :].removeprefix(" ").rstrip()


def parse(path: Path) -> ProtoFile:
    """Parse one .proto file into its services, messages and enums."""
    proto = ProtoFile(stem=path.stem, package="", doc=[])
    stack: list[Block] = []
    pending: list[str] = []
    statement = ""
    statement_doc: list[str] = []
    seen_declaration = False

    def finish(text: str, terminator: str, doc: list[str]) -> Field | Rpc | Block | None:
        nonlocal seen_declaration
        text = " ".join(text.split())
        if terminator == "}":
            stack.pop()
            return None
        if terminator == "{":
            kind, _, name = text.partition(" ")
            if kind not in ("service", "message", "enum", "oneof"):
                raise ValueError(f"{path.name}: unexpected block {text!r}")
            seen_declaration = True
            parent = next((b for b in reversed(stack) if b.kind == "message"), None)
            full = f"{parent.name}.{name}" if parent and kind in ("message", "enum") else name
            block = Block(kind=kind, name=full, doc=doc)
            owners = {"service": proto.services, "message": proto.messages, "enum": proto.enums}
            if kind in owners:
                owners[kind].append(block)
            stack.append(block)
            return block
        if not text:
            return None
        if text.startswith("package "):
            proto.package = text.split()[1]
            if doc and not seen_declaration:
                proto.doc = doc
            return None
        if text.startswith(("syntax", "import", "option", "reserved")):
            return None
        if not stack:
            raise ValueError(f"{path.name}: statement outside a block: {text!r}")
        top = stack[-1]
        if top.kind == "service":
            m = _RPC.match(text)
            if not m:
                raise ValueError(f"{path.name}: cannot read rpc {text!r}")
            rpc = Rpc(m[1], m[3], bool(m[2]), m[5], bool(m[4]), doc)
            top.rpcs.append(rpc)
            return rpc
        if top.kind == "enum":
            m = _ENUM_VALUE.match(text)
            if not m:
                raise ValueError(f"{path.name}: cannot read enum value {text!r}")
            value = Field(m[1], "", m[2], "", doc)
            top.fields.append(value)
            return value
        m = _FIELD.match(text)
        if not m:
            raise ValueError(f"{path.name}: cannot read field {text!r}")
        label = m[1] or ""
        ftype = m[2]
        if ftype.startswith("map"):
            label, ftype = "map", re.sub(r"\s+", "", ftype)
        # A oneof's fields belong to the enclosing message.
        message = next(b for b in reversed(stack) if b.kind == "message")
        oneof = top.name if top.kind == "oneof" else ""
        item = Field(m[3], ftype, m[4], label, doc, oneof)
        message.fields.append(item)
        return item

    for raw in path.read_text().splitlines():
        code, comment = _split_comment(raw)
        if not code.strip():
            if comment is not None:
                pending.append(comment)
            elif not statement:
                # A blank line detaches a comment from what follows it.
                if pending and not proto.doc and not seen_declaration:
                    proto.doc = pending
                pending = []
            continue
        last: Field | Rpc | Block | None = None
        for char in code:
            if char in "{};":
                if not statement.strip() and char == ";":
                    continue
                doc = statement_doc or pending
                last = finish(statement, char, doc) or last
                statement, statement_doc, pending = "", [], []
            else:
                if not statement.strip() and not char.isspace():
                    statement_doc, pending = pending, []
                statement += char
        if comment is not None and last is not None and not last.doc:
            # A trailing comment documents the statement it follows.
            last.doc = [comment]
    if stack:
        raise ValueError(f"{path.name}: unclosed block {stack[-1].name}")
    return proto


def _escape(text: str) -> str:
    """Markdown-safe text: comments are prose, not markup (code spans kept)."""
    parts = re.split(r"(`[^`]*`)", text)
    out = []
    for part in parts:
        if part.startswith("`") and part.endswith("`") and len(part) > 1:
            out.append(part)
            continue
        part = html.escape(part, quote=False)
        out.append(re.sub(r"([\\*_\[\]{}#|!])", r"\\\1", part))
    return "".join(out)


_CODE_ITEM = re.compile(r"^[A-Z][A-Z_]{3,}:")


def render_doc(lines: list[str]) -> str:
    """A comment block as Markdown: prose paragraphs, status codes as a list.

    A line that opens with a gRPC status code (``NOT_FOUND: ...``), indented
    or not, starts a list item; any other indented line continues the item
    or paragraph above it.
    """
    paragraphs: list[tuple[str, str]] = []  # ("p" | "li", text)
    for line in lines:
        stripped = line.strip()
        if not stripped:
            paragraphs.append(("p", ""))
            continue
        continues = line.startswith(" ") and paragraphs and paragraphs[-1][1]
        if _CODE_ITEM.match(stripped):
            paragraphs.append(("li", stripped))
        elif continues or (paragraphs and paragraphs[-1][0] == "p" and paragraphs[-1][1]):
            kind, text = paragraphs[-1]
            paragraphs[-1] = (kind, f"{text} {stripped}")
        else:
            paragraphs.append(("p", stripped))
    out: list[str] = []
    previous = ""
    for kind, text in paragraphs:
        if not text:
            continue
        if kind == "li":
            code, _, rest = text.partition(":")
            if previous != "li":
                out.append("")
            out.append(f"- `{code}`: {_escape(rest.strip())}")
        else:
            out.extend(["", _escape(text)])
        previous = kind
    return "\n".join(out).strip() + "\n"


def _one_line(lines: list[str]) -> str:
    return _escape(" ".join(line.strip() for line in lines if line.strip())).replace("\n", " ")


class Reference:
    """Every proto file of the package, with a resolver from type names to anchors."""

    def __init__(self, proto_dir: Path = PROTO_DIR) -> None:
        self.files = [parse(p) for p in sorted(proto_dir.glob("*.proto"))]
        self.anchors: dict[str, str] = {}  # full name -> "page.md#anchor"
        for proto in self.files:
            for block in (*proto.messages, *proto.enums, *proto.services):
                full = f"{proto.package}.{block.name}"
                self.anchors[full] = f"{proto.stem}.md#{full}"

    def resolve(self, name: str, package: str, scope: str) -> str:
        """The Markdown for a type: a link to its entry, or its name in code."""
        if name in SCALARS or name in WELL_KNOWN:
            return f"`{name}`"
        if name.startswith("map<"):
            key, value = name[4:-1].split(",")
            return f"map&lt;{self.resolve(key, package, scope)}, {self.resolve(value, package, scope)}&gt;"
        candidates = [name] if "." in name and name.split(".")[0] == package.split(".")[0] else []
        parts = scope.split(".") if scope else []
        while True:
            candidates.append(".".join([package, *parts, name]))
            if not parts:
                break
            parts.pop()
        for full in candidates:
            if full in self.anchors:
                return f"[`{name}`]({self.anchors[full]})"
        log.warning("proto reference: type %r (in %s %s) resolves to nothing", name, package, scope)
        return f"`{name}`"

    def rpcs(self) -> list[str]:
        """Full names of every RPC: ``sandboxd.v1.SandboxService.Acquire``."""
        return [f"{p.package}.{s.name}.{r.name}" for p in self.files for s in p.services for r in s.rpcs]

    def page(self, proto: ProtoFile) -> str:
        """The reference page of one .proto file."""
        pkg = proto.package
        out = [f"# {proto.stem}.proto", ""]
        out.append(
            f"Generated from `proto/sandboxd/v1/{proto.stem}.proto` at build time: "
            "edit the comments there, not this page.\n"
        )
        if proto.doc:
            out.append(render_doc(proto.doc))
        if proto.services:
            out.append("## Services\n")
        for service in proto.services:
            full = f"{pkg}.{service.name}"
            if not service.doc:
                log.warning("proto reference: service %s has no comment", full)
            out.append(f"### {service.name} {{ #{full} }}\n")
            out.append(render_doc(service.doc))
            for rpc in service.rpcs:
                rfull = f"{full}.{rpc.name}"
                if not rpc.doc:
                    log.warning("proto reference: rpc %s has no comment", rfull)
                req = ("stream " if rpc.request_stream else "") + rpc.request
                resp = ("stream " if rpc.response_stream else "") + rpc.response
                out.append(f"#### {rpc.name} {{ #{rfull} }}\n")
                out.append(f"```proto\nrpc {rpc.name}({req}) returns ({resp});\n```\n")
                out.append(
                    f"Request: {self.resolve(rpc.request, pkg, '')} · "
                    f"response: {self.resolve(rpc.response, pkg, '')}\n"
                )
                out.append(render_doc(rpc.doc))
        if proto.messages:
            out.append("## Messages\n")
        for message in proto.messages:
            full = f"{pkg}.{message.name}"
            out.append(f"### {message.name} {{ #{full} }}\n")
            if message.doc:
                out.append(render_doc(message.doc))
            if not message.fields:
                out.append("No fields.\n")
                continue
            out.append("| field | type | description |")
            out.append("|---|---|---|")
            for f in message.fields:
                typ = self.resolve(f.type, pkg, message.name)
                if f.label in ("repeated", "optional"):
                    typ = f"{f.label} {typ}"
                note = f"one of `{f.oneof}`. " if f.oneof else ""
                out.append(f"| `{f.name}` = {f.number} | {typ} | {note}{_one_line(f.doc)} |")
            out.append("")
        if proto.enums:
            out.append("## Enums\n")
        for enum in proto.enums:
            full = f"{pkg}.{enum.name}"
            out.append(f"### {enum.name} {{ #{full} }}\n")
            if enum.doc:
                out.append(render_doc(enum.doc))
            out.append("| value | number | description |")
            out.append("|---|---|---|")
            for v in enum.fields:
                out.append(f"| `{v.name}` | {v.number} | {_one_line(v.doc)} |")
            out.append("")
        return "\n".join(out)

    def index(self) -> str:
        """The overview page: every service and RPC with its first sentence."""
        out = [
            "# gRPC API",
            "",
            "Every service of `sandboxd.v1`, generated from the comments in "
            "`proto/sandboxd/v1/` at build time. Each RPC's entry names the status "
            "codes it answers. The server also serves standard gRPC health checking "
            "and server reflection.",
            "",
        ]
        for proto in self.files:
            for service in proto.services:
                full = f"{proto.package}.{service.name}"
                out.append(f"## [{service.name}]({proto.stem}.md#{full})\n")
                out.append(render_doc(service.doc))
                out.append("| RPC | what it does |")
                out.append("|---|---|")
                for rpc in service.rpcs:
                    first = " ".join(rpc.doc).split(". ")[0].strip().rstrip(".")
                    out.append(f"| [`{rpc.name}`]({proto.stem}.md#{full}.{rpc.name}) | {_escape(first)} |")
                out.append("")
        return "\n".join(out)


def on_files(files: Any, config: Any) -> Any:
    """Add the generated reference pages to the build."""
    from mkdocs.structure.files import File

    reference = Reference()
    files.append(File.generated(config, f"{OUT_DIR}/index.md", content=reference.index()))
    for proto in reference.files:
        files.append(File.generated(config, f"{OUT_DIR}/{proto.stem}.md", content=reference.page(proto)))
    return files


def on_serve(server: Any, config: Any, builder: Any) -> Any:
    """Rebuild when a proto changes under ``mkdocs serve``."""
    server.watch(str(PROTO_DIR))
    return server
