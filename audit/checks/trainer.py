"""The trainer view: what a trainer fed text would train on instead of each record's exact sample.

These rules run only when the run carries a trainer (`--trainer specforge[:TEMPLATE]` or
`--trainer speculators`; `requires = "trainer"`: the rule set leaves them out otherwise). Each
reads one kind of difference from the per-batch view (`audit.records.trainer_view`), which
re-does the trainer's own preprocessing on the record's conversation and compares the result
with the exact sample, `input_ids + output_ids` with the output trained. docs/trainer-view.md.
"""

from __future__ import annotations

from typing import ClassVar

import polars as pl

from audit.checks.base import RecordRule, Severity
from audit.records.batch import Batch
from audit.records.trainer_view import trainer_view


class TrainerViewRule(RecordRule):
    """Base of the trainer view's rules: a column of the view, and where it points."""

    requires: ClassVar[str | None] = "trainer"
    reads_source = True
    encodes_text = True
    column: ClassVar[str]
    at: ClassVar[str | None] = None
    # Why the records it flags are trained on something else, for the run's summary line.
    cause: ClassVar[str] = ""

    def applies(self, batch: Batch) -> bool:
        return batch.context.trainer is not None

    def frame(self, batch: Batch) -> pl.DataFrame:
        return trainer_view(batch)

    def violation(self, batch: Batch) -> pl.Expr:
        return pl.col(self.column).is_not_null()

    def position(self, batch: Batch) -> pl.Expr:
        return pl.col(self.at) if self.at else pl.lit(None, dtype=pl.Int64)

    def message(self, batch: Batch) -> pl.Expr:
        return pl.col(self.column)


class TrainerSystemPrompt(TrainerViewRule):
    """The trainer adds its default system prompt where the record has none: a changed prompt.

    What it checks:
        A record whose `messages` open with no system message, given to a SpecForge template
        with a `system_prompt` (`qwen3-thinking`: "You are a helpful assistant."): SpecForge's
        parser inserts that prompt before rendering (parse.py, GeneralParser.parse). The
        finding points at the prompt's start.

    Why it matters:
        The drafter is trained on the target's hidden states over the sequence it is given.
        With a system turn the model never saw, every position is conditioned on another
        prompt than at generation and at serving time: the record is trained on something
        else, and the whole dataset shifts the same way.

    Example:
        the record: <|im_start|>user\\nWhat is 2+2?...   SpecForge: <|im_start|>system\\nYou are a
        helpful assistant.<|im_end|>\\n<|im_start|>user\\nWhat is 2+2?...

    Fix:
        Feed the trainer the exact ids (SpecForge's `input_ids` + `loss_mask` prompts file), or
        save the system message the prompts were rendered with in `messages`, or register a
        SpecForge template whose `system_prompt` is None.
    """

    code = "TRN001"
    name = "trainer-system-prompt"
    position_field: ClassVar[str] = "input_ids"
    column = "system_added"
    cause = "its default system prompt was added"

    def position(self, batch: Batch) -> pl.Expr:
        return pl.lit(0, dtype=pl.Int64)


class TrainerIdsChanged(TrainerViewRule):
    """The trainer's re-rendered, re-tokenised text is not the record's exact ids.

    What it checks:
        The record's conversation, as the trainer renders it (its own changes undone: the
        data's system message, every message, the arguments as written), encoded again,
        against `input_ids + output_ids`. The finding names the first differing position
        (`input_ids[k]` or `output_ids[k]`) and decodes both sides there. The template's
        separator after the last turn is not a difference: SpecForge renders the last turn
        with add_generation_prompt=False, so its text ends `<|im_end|>\\n`, one token past the
        model's `<|im_end|>`; whitespace-only tokens after the sample's final stop token are
        left out of the comparison.

    Why it matters:
        Text is not ids. Markers the data holds as plain-text pieces encode back to the special
        token, non-canonical ids merge, whitespace the template rewrites moves, an output with
        no end of turn gets one: the trainer trains on ids the model never produced, where the
        exact sample trains on what it did.

    Example:
        from output_ids[23]: the sample has '<' 'tool' '_call' '>', the trainer '<tool_call>'

    Fix:
        Train on the exact ids (pre-tokenized `input_ids` + `loss_mask`); or repair the records
        the round-trip rules (RTR001, TCL004) name before feeding text.
    """

    code = "TRN002"
    name = "trainer-ids-changed"
    column = "ids_changed"
    at = "ids_at"
    cause = "its re-tokenized text differs from the exact ids"


class TrainerMaskChanged(TrainerViewRule):
    """The trainer's loss mask leaves output tokens untrained, or trains the prompt before them.

    What it checks:
        Where the trainer's ids and the sample's are the same tokens, its mask against the
        sample's (0 over the prompt, 1 over the output): output tokens it does not train
        (SpecForge's ignore_token texts, a token merged across its pattern's bound), and prompt
        tokens right before the output it trains (an assistant header that ends before the
        generation prompt does: `qwen3-thinking` on Qwen3.5 trains the prompt's `<think>\\n`;
        Kimi's trains its `<think>`). Earlier assistant turns of the prompt are TRN009's.

    Why it matters:
        The mask decides which predictions the drafter learns. Untrained output tokens are lost
        signal at exactly the positions a template varies (thinking, tool calls); trained
        prompt tokens teach it predictions the model never made.

    Example:
        the 2 prompt token(s) before the output trained too, from input_ids[314] '<think>\\n'

    Fix:
        Choose the trainer template whose assistant header is the model's generation prompt
        (`qwen3.5` for Qwen3.5/3.6), or train on the exact ids with their mask.
    """

    code = "TRN003"
    name = "trainer-mask-changed"
    column = "mask_changed"
    at = "mask_at"
    cause = "its loss mask does not cover the output exactly"


class TrainerReasoningDropped(TrainerViewRule):
    """The trainer drops the record's reasoning: the text it trains on has none of it.

    What it checks:
        The output's reasoning (what the server returns as `reasoning_content`), when not in
        the text the trainer trains on: SpecForge's general and GLM parsers keep no
        `reasoning_content` key (`qwen3-instruct`, `kimi-k2-instruct`), and some chat templates
        do not write it for the turn (Kimi-K2.5's writes `<think></think>` for a last answer
        without tool calls). Earlier turns' reasoning counts when the template would write it.

    Why it matters:
        A thinking model's output is mostly reasoning. Trained without it, the drafter learns
        the answer as if it followed the prompt directly, which the model never does: at
        serving time it drafts the wrong kind of text for most of every turn.

    Example:
        the chat template does not write this turn's reasoning_content (328 characters)

    Fix:
        Use a thinking template whose parser keeps `reasoning_content` (`qwen3-thinking`,
        `kimi-k2-thinking`), check the chat template writes the last turn's reasoning, or train
        on the exact ids.
    """

    code = "TRN004"
    name = "trainer-reasoning-dropped"
    column = "reasoning_dropped"
    at = "reasoning_at"
    cause = "its reasoning was dropped"


class TrainerRoleOrder(TrainerViewRule):
    """The trainer cuts the conversation at a message out of role order.

    What it checks:
        SpecForge's parser drops leading messages before the first user turn, and cuts the
        conversation at the first tool message that follows neither an assistant nor a tool
        message, or the first assistant message that follows neither a user nor a tool message
        (a prefilled assistant turn, two assistant turns in a row). The message says how many
        messages go, from which, why, and whether the record's own output is among them.

    Why it matters:
        Everything after the cut is never rendered: the prompt loses its tail, and when the
        output is cut with it the record trains nothing of what the model wrote.

    Example:
        drops 2 of 4 messages by role order, from message 2: an 'assistant' message must follow
        a 'user' or 'tool' message, not 'assistant'; the record's own output is among them

    Fix:
        Save conversations in a role order the trainer accepts (merge consecutive assistant
        messages), or train on the exact ids.
    """

    code = "TRN005"
    name = "trainer-role-order"
    position_field: ClassVar[str] = "input_ids"
    column = "truncated"
    cause = "its conversation was cut by role order"


class TrainerMaxLength(TrainerViewRule):
    """The trainer cuts the record's sequence at its max_length.

    What it checks:
        The trainer's sequence longer than its `max_length` (SpecForge: 2048 by default;
        speculators: `--seq-length`, 8192; `--trainer-max-length N` sets it): the tokens after
        it are not trained. speculators skips a turn whose prompt alone fills it. The finding
        points at the first output token lost.

    Why it matters:
        The end of a long output is where its answer and tool calls are: cut there, the
        drafter never sees how such turns end, and a dataset of long reasoning loses its most
        useful part.

    Example:
        cuts the sequence at max_length 2048: its last 311 tokens are not trained, 311 of them
        the output's

    Fix:
        Raise the trainer's max_length to the longest record, or filter records longer than it
        before training.
    """

    code = "TRN006"
    name = "trainer-max-length"
    column = "cut"
    at = "cut_at"
    cause = "its sequence was cut at max_length"


class TrainerArgumentsEmptied(TrainerViewRule):
    """The trainer writes tool-call arguments that do not parse as JSON as `{}`.

    What it checks:
        SpecForge's `_sanitize_message` reads each call's `arguments` string with json.loads
        and writes `{}` when it fails (and drops a `tool_calls` string that is not JSON). The
        finding says which tools and whether the call is the record's own output (pointing at
        it) or in the prompt's history. speculators instead drops the conversation (TRN008).

    Why it matters:
        The call is trained with empty arguments: the drafter learns that the model calls the
        tool with nothing, the opposite of what it wrote.

    Example:
        writes 1 call(s)' arguments as {} (get_weather): they do not parse as JSON (in the
        record's own output)

    Fix:
        Quarantine the records TCL002 flags (arguments that are not JSON) before training.
    """

    code = "TRN007"
    name = "trainer-arguments-emptied"
    column = "emptied"
    at = "emptied_at"
    cause = "its tool-call arguments became {}"


class TrainerRecordDropped(TrainerViewRule):
    """The trainer trains nothing of the record.

    What it checks:
        The trainer skips or refuses the record's conversation: SpecForge raises on it (a chat
        template error it does not catch stops its whole preprocessing run), or trains none
        of its tokens (no assistant turn matches its pattern); speculators drops the
        conversation (a render the server refuses, such as tool-call arguments that are not
        JSON; renders that diverge inside the history) or makes no row for the record's turn.

    Why it matters:
        The record is lost from training, and for SpecForge a template error on one record
        ends the run.

    Example:
        trains nothing of it: the chat template raises on it (TemplateError: Unexpected message
        role.): SpecForge stops

    Fix:
        Fix the conversation the message names (a role the template knows, arguments that are
        JSON), or leave the record out.
    """

    code = "TRN008"
    name = "trainer-record-dropped"
    column = "refused"
    cause = "it would not be trained at all"


class TrainerHistoryTrained(TrainerViewRule):
    """The trainer also trains the earlier assistant turns of the record's prompt.

    What it checks:
        SpecForge masks every assistant turn its pattern finds in the rendered conversation,
        so the prompt's earlier assistant turns (the history of a multi-turn record, the call
        before a tool result) are trained with the output; speculators builds one more row per
        earlier assistant turn. The finding counts the prompt tokens (or rows) trained.

    Why it matters:
        Those turns are the conversation's history: text the model did not write in this
        record (often another model's, or a dataset's). Trained on them, the drafter learns
        predictions of text the target does not produce. A warning: whether the history is the
        target's own text is something only the data's maker knows.

    Example:
        also trains 65 token(s) of this record's prompt, its earlier assistant turns

    Fix:
        SpecForge: `train_only_last_turn`; speculators: keep one assistant turn per record; or
        train on the exact ids and mask.
    """

    code = "TRN009"
    name = "trainer-history-trained"
    severity: ClassVar[Severity] = Severity.WARNING
    position_field: ClassVar[str] = "input_ids"
    column = "history_trained"
    cause = "it also trains the prompt's earlier assistant turns"


class TrainerNotViewed(TrainerViewRule):
    """A record the trainer view cannot build a conversation for: no `messages`, or bad ids.

    What it checks:
        A trainer fed text is given each record's `messages` (and `tools`) plus its output as
        the assistant's reply. A record that carries no `messages` (and no `--prompts FILE`
        maps its id to them), whose `messages` is not a list, or whose ids are missing or
        outside the vocabulary (the INT rules' findings) cannot be given to it: the view says
        so here and leaves the record out of its summary.

    Why it matters:
        Such records are trainable only as exact ids: a team that feeds the trainer text has
        nothing to feed it for them, and the view cannot say what the trainer would do.

    Example:
        the record carries no `messages`: a trainer fed text has nothing to build

    Fix:
        Save `messages` and `tools` on each record (or pass `--prompts FILE`), or train on the
        exact ids.
    """

    code = "TRN010"
    name = "trainer-not-viewed"
    severity: ClassVar[Severity] = Severity.WARNING
    column = "not_viewed"
    cause = ""
