"""A stand-in SGLang server for tests: the native `/generate` protocol on loopback, stdlib only.

It speaks what `audit generate` relies on, as SGLang 0.5.x documents it (see
shared/docs/domain.md): `POST /generate` with exactly one of `text` / `input_ids` (a list of
ints, or a list of lists for a batch), `sampling_params` (a dict, or a list per item) whose
keys are checked strictly (an unknown key is HTTP 400), and answers `{"text", "output_ids",
"meta_info"}` (a list for a batch) with `finish_reason` shaped `{"type": "stop", "matched": ID}`
or `{"type": "length", "length": N}`. `GET /health`, `/model_info` (or only the older
`/get_model_info`).

The "model" is deterministic: for a prompt it answers
`encode("reasoning ...") + </think> + encode("answer ...") + <|im_end|>`, with words drawn
from a hash of the prompt ids, so a test can recompute exactly what was sent.

It misbehaves on demand: every k-th `/generate` request answered with 503, slow answers,
answers trickled a byte at a time (`trickle`), answers whose body cannot be used
(`bad_body`: a gzip `Content-Encoding` on a plain body, JSON cut short, or JSON that is not a
result), dropped connections, prompts over a context length rejected with 400, a mode that
strips `</think>` from `output_ids` (what a reasoning parser does to data), and a server that
goes down and comes back on the same port (`refuse_connections()`, `accept_connections()`).

    with SGLangStandin(KIMI_TOKENIZER, fail_every=4) as server:
        server.url   # http://127.0.0.1:PORT
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import socket
import sys
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer

SAMPLING_KEYS = frozenset(
    {
        "max_new_tokens",
        "temperature",
        "top_p",
        "top_k",
        "min_p",
        "stop",
        "stop_token_ids",
        "ignore_eos",
        "skip_special_tokens",
        "spaces_between_special_tokens",
        "no_stop_trim",
        "repetition_penalty",
        "frequency_penalty",
        "presence_penalty",
        "min_new_tokens",
        "n",
        "sampling_seed",
    }
)
REQUEST_KEYS = frozenset(
    {
        "text",
        "input_ids",
        "sampling_params",
        "rid",
        "stream",
        "return_logprob",
        "return_prompt_token_ids",
        "image_data",
    }
)
DEFAULT_MAX_NEW_TOKENS = 128
WORDS = ["alpha", "beta", "gamma", "delta", "careful", "answer", "user", "wants", "number", "convert", "check", "the", "value", "of", "this", "that", "result", "first", "then", "finally", "compute", "sum", "list", "tool", "call", "reason", "about", "it"]


# Answers of HTTP 200 that are not a usable /generate result, by `bad_body` name.
BAD_BODIES = ("encoding", "json", "shape")


class BadRequest(Exception):
    """Answered with HTTP 400 and SGLang's error body."""


class SGLangStandin:
    """A threaded HTTP server on 127.0.0.1 speaking SGLang's native protocol."""

    def __init__(
        self,
        tokenizer_dir: Path,
        *,
        think_end: str = "</think>",
        end_of_turn: str = "<|im_end|>",
        fail_every: int = 0,
        fail_status: int = 503,
        fail_all_paths: bool = False,
        drop_every: int = 0,
        delay: float = 0.0,
        strip_think: bool = False,
        context_length: int | None = None,
        legacy_info: bool = False,
        model_path: str | None = None,
        reasoning_words: int = 12,
        trickle: float = 0.0,
        bad_body: str | None = None,
        bad_body_every: int = 1,
        port: int = 0,
        vision: str | None = None,
    ):
        if bad_body is not None and bad_body not in BAD_BODIES:
            raise ValueError(f"bad_body must be one of {BAD_BODIES}")
        self.tokenizer = Tokenizer.from_file(str(Path(tokenizer_dir) / "tokenizer.json"))
        self.think_start: int | None = None  # written first when the prompt leaves it to the model
        self.think_gaps = ("", "")  # the text before and after the reply's think end
        if vision is not None:  # the profile's own markers (GLM ends a turn on <|user|>)
            from audit.model.families.profiles import load_profile

            profile = load_profile(vision)
            think_end = profile.think_end or think_end
            end_of_turn = profile.end_of_turn[0] if profile.end_of_turn else end_of_turn
            if profile.think_start is not None:
                self.think_start = self.tokenizer.token_to_id(profile.think_start)
            self.think_gaps = {"qwen3.6": ("\n", "\n\n")}.get(vision, self.think_gaps)
        self.think_end = self.tokenizer.token_to_id(think_end)
        self.end_of_turn = self.tokenizer.token_to_id(end_of_turn)
        for marker, found in ((think_end, self.think_end), (end_of_turn, self.end_of_turn)):
            if found is None:
                raise ValueError(f"the tokenizer in {tokenizer_dir} has no token {marker!r}: the stand-in "
                                 "answers with it (pass --vision PROFILE to take the profile's own markers)")
        self.fail_every = fail_every
        self.fail_status = fail_status
        self.fail_all_paths = fail_all_paths  # count /health and /model_info too for fail_every
        self.requests = 0  # every request on any path
        self.drop_every = drop_every
        self.delay = delay
        self.strip_think = strip_think
        self.context_length = context_length
        self.legacy_info = legacy_info
        self.model_path = model_path or str(tokenizer_dir)
        self.reasoning_words = reasoning_words
        self.trickle = trickle  # seconds between the bytes of a /generate answer's body
        self.bad_body = bad_body
        self.bad_body_every = bad_body_every
        # `vision` (a profile name): a multimodal model's server (Qwen-VL). Each image pad of a
        # prompt is expanded to the image's N tokens, N counted as the project counts it
        # (audit.model.families.vision) with the tokenizer folder's preprocessor_config.json;
        # `image_data` must hold one image per pad; `prompt_tokens` counts the expanded prompt.
        self.vision = None
        if vision is not None:
            from audit.model.families.profiles import load_profile

            self.vision = load_profile(vision).vision
            assert self.vision is not None, f"profile {vision} has no [vision] table"
        self.image_pad = self.tokenizer.token_to_id(self.vision.image_pad) if self.vision else None
        self.tokenizer_dir = Path(tokenizer_dir)
        self.lock = threading.Lock()
        self.connections: set[socket.socket] = set()  # open client connections
        self.generate_requests = 0  # every /generate request, answered or not
        self.received: list[dict[str, Any]] = []  # request bodies that were answered with 200
        self.sent: dict[tuple[int, ...], list[int]] = {}  # prompt ids -> output ids answered
        self._server: _QuietServer | None = self._listen(port)
        self.port = self._server.server_address[1]
        self._thread: threading.Thread | None = None

    def _listen(self, port: int) -> _QuietServer:
        server = _QuietServer(("127.0.0.1", port), _handler_for(self))
        server.daemon_threads = True
        return server

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> SGLangStandin:
        assert self._server is not None
        self._thread = threading.Thread(
            target=self._server.serve_forever, args=(0.05,), daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        self._hang_up()

    def refuse_connections(self) -> None:
        """Go down like a crashed server: open connections cut, new ones refused (same port)."""
        self.stop()

    def accept_connections(self) -> None:
        """Come back on the same port after `refuse_connections()`."""
        self._server = self._listen(self.port)
        self.start()

    def _hang_up(self) -> None:
        with self.lock:
            connections, self.connections = list(self.connections), set()
        for connection in connections:
            with contextlib.suppress(OSError):
                connection.shutdown(socket.SHUT_RDWR)

    def __enter__(self) -> SGLangStandin:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- the "model" --------------------------------------------------------------------
    def model_output(self, input_ids: list[int]) -> list[int]:
        """The ids this server's model emits for a prompt (before `max_new_tokens` or faults)."""
        digest = hashlib.sha256(json.dumps(input_ids).encode()).digest()
        reasoning = " ".join(WORDS[b % len(WORDS)] for b in digest[: self.reasoning_words])
        answer = " ".join(WORDS[b % len(WORDS)] for b in digest[-6:])
        opened = [] if self.think_start is None or self.think_start in input_ids[-4:] else [self.think_start]
        # A vision model's reply closes its reasoning as its template writes a past turn (Qwen:
        # "\n</think>\n\n"), so that `audit export` renders the row back to its ids.
        before, after = self.think_gaps
        return (
            opened
            + self.tokenizer.encode(f"Let me think: {reasoning}.{before}", add_special_tokens=False).ids
            + [self.think_end]
            + self.tokenizer.encode(f"{after}The answer: {answer}.", add_special_tokens=False).ids
            + [self.end_of_turn]
        )

    def expanded_length(self, input_ids: list[int], image_data: Any) -> int:
        """The prompt's length once each image pad is expanded to its image's tokens."""
        images = [image_data] if isinstance(image_data, str) else image_data or []
        pads = input_ids.count(self.image_pad) if self.image_pad is not None else 0
        if images and self.image_pad is None:
            raise BadRequest("this model takes no images")
        if len(images) != pads:
            raise BadRequest(f"{pads} image tokens in the prompt but {len(images)} images in image_data")
        return len(input_ids) - pads + sum(self._image_tokens(entry) for entry in images)

    def _image_tokens(self, entry: Any) -> int:
        import base64
        import binascii

        from audit.model.families.vision import image_tokens, processor_settings
        from audit.records.images import image_bytes

        if not isinstance(entry, str) or not entry.startswith("data:") or "," not in entry:
            raise BadRequest(f"this stand-in reads images sent as data: URIs only, got {str(entry)[:40]!r}")
        try:
            data = base64.b64decode(entry.partition(",")[2], validate=True)
        except (binascii.Error, ValueError):
            raise BadRequest("an image whose base64 does not decode") from None
        size = image_bytes(data).size
        if size is None:
            raise BadRequest("an image the processor cannot read")
        assert self.vision is not None
        tokens = image_tokens(size[0], size[1], processor_settings(self.tokenizer_dir, self.vision.defaults))
        if tokens is None:
            raise BadRequest("an image the processor refuses")
        return tokens

    def answer(self, input_ids: list[int], params: dict[str, Any], image_data: Any = None) -> dict[str, Any]:
        """One item of a /generate answer, as SGLang shapes it."""
        if self.context_length is not None and len(input_ids) > self.context_length:
            raise BadRequest(
                f"The input ({len(input_ids)} tokens) is longer than the model's context length "
                f"({self.context_length} tokens)."
            )
        started = time.perf_counter()
        prompt_tokens = self.expanded_length(input_ids, image_data)
        output = self.model_output(input_ids)
        if self.strip_think:
            output = [i for i in output if i != self.think_end]
        limit = int(params.get("max_new_tokens", DEFAULT_MAX_NEW_TOKENS))
        stops = set(params.get("stop_token_ids") or []) | {self.end_of_turn}
        cut = next((n + 1 for n, i in enumerate(output) if i in stops), len(output))
        output = output[:cut]
        if len(output) > limit:
            output = output[:limit]
            finish: dict[str, Any] = {"type": "length", "length": limit}
        else:
            finish = {"type": "stop", "matched": output[-1]}
        shown = output
        if not params.get("no_stop_trim", False) and finish["type"] == "stop":
            shown = output[:-1]  # SGLang trims the matched stop from `text`, never from the ids
        text = self.tokenizer.decode(
            shown, skip_special_tokens=params.get("skip_special_tokens", True)
        )
        with self.lock:
            self.sent[tuple(input_ids)] = output
        return {
            "text": text,
            "output_ids": output,
            "meta_info": {
                "id": uuid.uuid4().hex,
                "finish_reason": finish,
                "prompt_tokens": prompt_tokens,
                "weight_version": "default",
                "completion_tokens": len(output),
                "cached_tokens": 0,
                "e2e_latency": round(time.perf_counter() - started, 6),
            },
        }

    def generate(self, body: Any) -> Any:
        """Validate a /generate body as SGLang does and answer it (single or batch form)."""
        if not isinstance(body, dict):
            raise BadRequest("request body must be a JSON object")
        unknown = set(body) - REQUEST_KEYS
        if unknown:
            raise BadRequest(f"unexpected keyword argument(s): {sorted(unknown)}")
        if ("text" in body) == ("input_ids" in body):
            raise BadRequest("Either text or input_ids should be provided.")
        if "text" in body:
            texts = body["text"]
            batch = isinstance(texts, list)
            prompts = [self.tokenizer.encode(t).ids for t in (texts if batch else [texts])]
        else:
            ids = body["input_ids"]
            if not isinstance(ids, list) or not ids:
                raise BadRequest("input_ids must be a non-empty list")
            batch = isinstance(ids[0], list)
            prompts = ids if batch else [ids]
            for prompt in prompts:
                if not isinstance(prompt, list) or not all(
                    isinstance(i, int) and not isinstance(i, bool) for i in prompt
                ):
                    raise BadRequest("input_ids must hold integers")
        params = body.get("sampling_params") or {}
        per_item = params if isinstance(params, list) else [params] * len(prompts)
        if len(per_item) != len(prompts):
            raise BadRequest("sampling_params list must match the batch size")
        for item in per_item:
            if not isinstance(item, dict):
                raise BadRequest("sampling_params must be an object")
            unknown = set(item) - SAMPLING_KEYS
            if unknown:
                raise BadRequest(
                    f"SamplingParams got unexpected keyword argument(s): {sorted(unknown)}"
                )
        images = body.get("image_data") if not batch else None
        answers = [self.answer(p, s, images) for p, s in zip(prompts, per_item, strict=True)]
        with self.lock:
            self.received.append(body)
        return answers if batch else answers[0]

    def model_info(self) -> dict[str, Any]:
        return {
            "model_path": self.model_path,
            "tokenizer_path": self.model_path,
            "is_generation": True,
            "preferred_sampling_params": None,
            "weight_version": "default",
        }


class _QuietServer(ThreadingHTTPServer):
    def handle_error(self, request: Any, client_address: Any) -> None:
        # A client that cancels its request hangs up before the answer is written: normal here.
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


def _handler_for(server: SGLangStandin) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:  # keep test output clean
            pass

        def setup(self) -> None:
            super().setup()
            with server.lock:
                server.connections.add(self.connection)

        def finish(self) -> None:
            with server.lock:
                server.connections.discard(self.connection)
            super().finish()

        def _send(
            self, status: int, payload: Any = None, *, raw: bytes | None = None, gzip: bool = False
        ) -> None:
            data = (
                raw if raw is not None else b"" if payload is None else json.dumps(payload).encode()
            )
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            if gzip:
                self.send_header("Content-Encoding", "gzip")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            if server.trickle and self.command == "POST":
                for byte in range(len(data)):  # each byte well within any per-read timeout
                    self.wfile.write(data[byte : byte + 1])
                    self.wfile.flush()
                    time.sleep(server.trickle)
            else:
                self.wfile.write(data)

        def _send_bad_body(self) -> None:
            if server.bad_body == "encoding":
                self._send(200, {"output_ids": [1, 2]}, gzip=True)  # says gzip, is not
            elif server.bad_body == "json":
                self._send(200, raw=b'{"output_ids": [1, 2')
            else:
                self._send(200, {"text": "no ids here", "meta_info": {}})

        def _fail_all_paths(self) -> bool:
            """With `fail_all_paths`, every k-th request on any path is answered with the failure."""
            with server.lock:
                server.requests += 1
                number = server.requests
            if server.fail_all_paths and server.fail_every and number % server.fail_every == 0:
                self._send(server.fail_status, {"error": {"message": "Service Unavailable"}})
                return True
            return False

        def do_GET(self) -> None:
            if self._fail_all_paths():
                return
            if self.path == "/health":
                self._send(200)
            elif self.path == "/get_model_info" or (
                self.path == "/model_info" and not server.legacy_info
            ):
                self._send(200, server.model_info())
            else:
                self._send(404, {"detail": "Not Found"})

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length)
            if self.path != "/generate":
                self._send(404, {"detail": "Not Found"})
                return
            with server.lock:
                server.generate_requests += 1
                number = server.generate_requests
            if self._fail_all_paths():
                return
            if server.delay:
                time.sleep(server.delay)
            if server.drop_every and number % server.drop_every == 0:
                self.close_connection = True  # hang up without an answer, like a crashed worker
                return
            if server.fail_every and not server.fail_all_paths and number % server.fail_every == 0:
                self._send(server.fail_status, {"error": {"message": "Service Unavailable"}})
                return
            if server.bad_body and number % server.bad_body_every == 0:
                self._send_bad_body()
                return
            try:
                self._send(200, server.generate(json.loads(raw)))
            except (BadRequest, json.JSONDecodeError) as exc:
                self._send(400, {"error": {"message": str(exc)}})

    return Handler


def _serve_from_command_line() -> None:
    """A server to try `audit generate` against by hand (README: Generating data)."""
    import argparse
    import os
    import signal

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("tokenizer")
    parser.add_argument("--port", type=int, default=0, help="port on 127.0.0.1 (default: any free one)")
    parser.add_argument("--background", action="store_true",
                        help="return once the server listens, leaving it to serve in the background")
    parser.add_argument("--pid-file", type=Path, help="write the serving process's id here")
    parser.add_argument("--exit-after", type=float, default=0.0, help="stop after this many seconds (0: never)")
    parser.add_argument("--fail-every", type=int, default=0)
    parser.add_argument("--vision", metavar="PROFILE", help="take images as this profile's model does, and answer with its markers (qwen3.6, glm-4.6v)")
    parser.add_argument("--strip-think", action="store_true")
    parser.add_argument("--delay", type=float, default=0.0)
    parser.add_argument("--trickle", type=float, default=0.0, help="seconds per answer byte")
    parser.add_argument("--bad-body", choices=BAD_BODIES)
    arguments = parser.parse_args()
    try:
        standin = SGLangStandin(
            Path(arguments.tokenizer),
            fail_every=arguments.fail_every,
            strip_think=arguments.strip_think,
            delay=arguments.delay,
            trickle=arguments.trickle,
            bad_body=arguments.bad_body,
            port=arguments.port,
            vision=arguments.vision,
        )
    except OSError as exc:
        sys.exit(f"sglang_standin: cannot listen on 127.0.0.1:{arguments.port}: {exc.strerror}")
    except ValueError as exc:
        sys.exit(f"sglang_standin: {exc}")
    if arguments.background and os.fork():
        os._exit(0)  # the parent returns: the port is already listening, the child serves
    if arguments.pid_file:
        arguments.pid_file.parent.mkdir(parents=True, exist_ok=True)
        arguments.pid_file.write_text(f"{os.getpid()}\n")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    standin.start()
    print(f"stand-in SGLang server on {standin.url} (pid {os.getpid()})", flush=True)
    if arguments.background:  # let go of the caller's terminal or pipe: it may be waiting for its end
        devnull = os.open(os.devnull, os.O_RDWR)
        for stream in (0, 1, 2):
            os.dup2(devnull, stream)
    try:
        time.sleep(arguments.exit_after) if arguments.exit_after > 0 else threading.Event().wait()
    except KeyboardInterrupt:
        pass
    finally:
        standin.stop()


if __name__ == "__main__":
    _serve_from_command_line()
