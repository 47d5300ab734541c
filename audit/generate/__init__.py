"""The generator: prompts to SGLang's native `/generate` as raw ids, every prompt exactly once.

Faithful by construction: each prompt is rendered into ids with the profile's renderer (the
tokenizer's own chat template; `audit.model.rendering.templating`, the rendering TPL001 audits against), the
ids are sent verbatim as `input_ids` (never text, never the OpenAI chat endpoint, never a
parser), and `input_ids`, `output_ids`, `text` and `meta_info` are saved exactly as the
server returned them, one JSON object per line, beside the source `messages`/`tools`.

| module | |
|---|---|
| `prompts` | the prompts file: one loader, also behind `audit check --prompts` |
| `datasets_in` | the rows of JSONL, Parquet, Arrow and `datasets` folders, streamed |
| `conversations` | ShareGPT, UltraChat and OpenAI rows normalised into chat messages |
| `manifest` | `generation.json`: written by a run, read by every command that audits one |
| `plan` | the options, and everything checked before the first request |
| `client` | the servers: the pool and its circuit breaker, one `/generate` call |
| `probes` | what a server says of itself: `/health`, model and server info |
| `server_errors` | how an answer is taken: a result, transient, unreachable, rejected |
| `output` | the append-only samples file (resume, crash recovery) and errors.jsonl |
| `canary` | the first samples, audited before the rest are sent |
| `runner` | the run itself: render, queue, send, retry, write |
| `events` | what a run reports as it goes: counters, events, the result |

    from audit.generate import GenerateOptions, Generator, plan_generation
    plan = plan_generation(GenerateOptions(...))
    result = asyncio.run(Generator(plan, events).run())

Names are imported from their module on first use, so reading a partition's manifest or
prompts does not load the HTTP client.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from audit.generate.canary import audit_lines
    from audit.generate.events import GenerationEvents, GenerationResult, RunStats
    from audit.generate.output import ERRORS_FILE
    from audit.generate.plan import GenerateOptions, GenerationPlan, plan_generation
    from audit.generate.probes import ServerProbe
    from audit.generate.prompts import (
        Prompt,
        PromptSummary,
        iter_prompts,
        load_prompts,
        scan_prompts,
        summarise_prompts,
    )
    from audit.generate.runner import Generator
    from audit.generate.server_errors import ServerError

# Public name -> the module that defines it.
_EXPORTS = {
    "GenerateOptions": "plan",
    "GenerationPlan": "plan",
    "plan_generation": "plan",
    "Generator": "runner",
    "GenerationEvents": "events",
    "GenerationResult": "events",
    "RunStats": "events",
    "ServerError": "server_errors",
    "ServerProbe": "probes",
    "Prompt": "prompts",
    "PromptSummary": "prompts",
    "summarise_prompts": "prompts",
    "iter_prompts": "prompts",
    "load_prompts": "prompts",
    "scan_prompts": "prompts",
    "audit_lines": "canary",
    "ERRORS_FILE": "output",
}
__all__ = [
    "ERRORS_FILE",
    "GenerateOptions",
    "GenerationEvents",
    "GenerationPlan",
    "GenerationResult",
    "Generator",
    "Prompt",
    "PromptSummary",
    "RunStats",
    "ServerError",
    "ServerProbe",
    "audit_lines",
    "iter_prompts",
    "load_prompts",
    "plan_generation",
    "scan_prompts",
    "summarise_prompts",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'audit.generate' has no attribute {name!r}")
    return getattr(importlib.import_module(f"audit.generate.{module}"), name)
