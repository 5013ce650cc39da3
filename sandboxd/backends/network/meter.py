"""What the model gateway records of one call: the request, token counts and,
where the server returns them, token ids and log-probs.

OpenAI-compatible servers spell these differently: ``usage`` for counts
(streamed only in a final chunk when asked for); vLLM's ``token_ids`` per
choice and ``prompt_token_ids`` (``return_token_ids``); chat log-probs as
``logprobs.content[].logprob``, completion log-probs as
``logprobs.token_logprobs``; token strings of the form ``token_id:N``
(vLLM's ``return_tokens_as_token_ids``) carry ids too. The parsers read every
spelling and keep what is there; nothing is made up when a server omits it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

MAX_RECORDED_REQUEST = 1 << 20
"""Request bytes kept per call; a longer body is recorded cut (``request_truncated``)."""


@dataclass
class ModelChoice:
    """One choice of a completion as the server generated it."""

    index: int = 0
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    """Log-probability of each generated token, in order (empty when the server sent none)."""
    finish_reason: str = ""


@dataclass
class ModelCall:
    """One request an in-sandbox agent made through the gateway, and what came back."""

    lease_id: str
    sandbox_id: str
    method: str
    path: str
    """Below the gateway's ``/v1`` (``/chat/completions``)."""
    started_at: float
    """Wall-clock seconds."""
    model: str = ""
    stream: bool = False
    status: int = 0
    """The server's HTTP status (0: it never answered)."""
    error: str = ""
    request: bytes = b""
    request_truncated: bool = False
    duration_seconds: float = 0.0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    prompt_token_ids: list[int] = field(default_factory=list)
    choices: list[ModelChoice] = field(default_factory=list)


def describe_request(call: ModelCall, body: bytes) -> None:
    """Fills the call's request, model and stream flag from the request body."""
    call.request = body[:MAX_RECORDED_REQUEST]
    call.request_truncated = len(body) > MAX_RECORDED_REQUEST
    try:
        doc = json.loads(body) if body else None
    except (ValueError, UnicodeDecodeError):
        return
    if isinstance(doc, dict):
        model = doc.get("model")
        call.model = model if isinstance(model, str) else ""
        call.stream = doc.get("stream") is True


def _ints(value: Any) -> list[int]:
    if isinstance(value, list) and all(isinstance(x, int) and not isinstance(x, bool) for x in value):
        return list(value)
    return []


def _token_id(token: Any) -> int | None:
    if isinstance(token, str) and token.startswith("token_id:") and token[9:].lstrip("-").isdigit():
        return int(token[9:])
    return None


class CallBuilder:
    """Gathers a response into ``call``: one JSON body, or the chunks of a stream, fed in order."""

    def __init__(self, call: ModelCall) -> None:
        self.call = call
        self._choices: dict[int, ModelChoice] = {}
        self._ids_from_tokens: dict[int, list[int]] = {}
        self._buffer = b""

    def body(self, data: bytes) -> None:
        """A whole (not streamed) JSON response."""
        try:
            doc = json.loads(data)
        except (ValueError, UnicodeDecodeError):
            return
        if isinstance(doc, dict):
            self._document(doc, streamed=False)

    def feed(self, chunk: bytes) -> None:
        """Bytes of a server-sent-event stream, cut anywhere."""
        self._buffer += chunk
        while b"\n" in self._buffer:
            line, self._buffer = self._buffer.split(b"\n", 1)
            self._line(line.strip())

    def _line(self, line: bytes) -> None:
        if not line.startswith(b"data:"):
            return
        data = line[5:].strip()
        if data == b"[DONE]":
            return
        try:
            doc = json.loads(data)
        except (ValueError, UnicodeDecodeError):
            return
        if isinstance(doc, dict):
            self._document(doc, streamed=True)

    def _document(self, doc: dict[str, Any], *, streamed: bool) -> None:
        usage = doc.get("usage")
        if isinstance(usage, dict):
            prompt, completion = usage.get("prompt_tokens"), usage.get("completion_tokens")
            if isinstance(prompt, int):
                self.call.prompt_tokens = prompt
            if isinstance(completion, int):
                self.call.completion_tokens = completion
        if not self.call.model and isinstance(doc.get("model"), str):
            self.call.model = doc["model"]
        prompt_ids = _ints(doc.get("prompt_token_ids"))
        if prompt_ids and not self.call.prompt_token_ids:
            self.call.prompt_token_ids = prompt_ids
        for raw in doc.get("choices") or []:
            if isinstance(raw, dict):
                self._choice(raw, streamed)

    def _choice(self, raw: dict[str, Any], streamed: bool) -> None:
        found = raw.get("index")
        index = found if isinstance(found, int) else 0
        choice = self._choices.setdefault(index, ModelChoice(index=index))
        delta = raw.get("delta") if streamed and isinstance(raw.get("delta"), dict) else raw.get("message")
        text = delta.get("content") if isinstance(delta, dict) else raw.get("text")
        if isinstance(text, str):
            choice.text += text
        choice.token_ids.extend(_ints(raw.get("token_ids")))
        if not self.call.prompt_token_ids:
            self.call.prompt_token_ids = _ints(raw.get("prompt_token_ids"))
        if isinstance(raw.get("finish_reason"), str):
            choice.finish_reason = raw["finish_reason"]
        logprobs = raw.get("logprobs")
        if isinstance(logprobs, dict):
            self._logprobs(index, choice, logprobs)

    def _logprobs(self, index: int, choice: ModelChoice, logprobs: dict[str, Any]) -> None:
        ids = self._ids_from_tokens.setdefault(index, [])
        content = logprobs.get("content")
        if isinstance(content, list):  # chat completions
            for entry in content:
                if isinstance(entry, dict) and isinstance(entry.get("logprob"), int | float):
                    choice.logprobs.append(float(entry["logprob"]))
                    token = _token_id(entry.get("token"))
                    if token is not None:
                        ids.append(token)
        values = logprobs.get("token_logprobs")
        if isinstance(values, list):  # completions
            choice.logprobs.extend(float(x) for x in values if isinstance(x, int | float))
            for token in logprobs.get("tokens") or []:
                token_id = _token_id(token)
                if token_id is not None:
                    ids.append(token_id)

    def finish(self) -> ModelCall:
        """The call with its choices in order; ids read from token strings fill in where none came."""
        if self._buffer:
            self._line(self._buffer.strip())
            self._buffer = b""
        for index, choice in self._choices.items():
            if not choice.token_ids and self._ids_from_tokens.get(index):
                choice.token_ids = self._ids_from_tokens[index]
        self.call.choices = [self._choices[i] for i in sorted(self._choices)]
        if not self.call.completion_tokens:
            self.call.completion_tokens = sum(len(c.token_ids) for c in self.call.choices)
        if not self.call.prompt_tokens:
            self.call.prompt_tokens = len(self.call.prompt_token_ids)
        return self.call
