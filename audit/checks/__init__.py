"""The registry of rules: one explicit table, greppable, in code order."""

from __future__ import annotations

from audit.checks.base import Rule, Severity
from audit.checks.degenerate import RepetitionLoop, SegmentTooShort
from audit.checks.harmony import ChannelGrammar, ChannelOrder, ChannelStrayText, ChannelToolCall
from audit.checks.images import (
    ImageNotChecked,
    ImageOutOfOrder,
    ImageUnreadable,
    PlaceholderCount,
    PreExpandedPads,
    VisionSpanBroken,
    VisionTokenInOutput,
)
from audit.checks.integrity import (
    DuplicateSampleId,
    MetaCountMismatch,
    RecordContract,
    TokenOutOfVocabulary,
    UnreadableLine,
)
from audit.checks.internal import InternalError
from audit.checks.marker_text import ToolMarkerAsText
from audit.checks.mix import ServingModeMissing
from audit.checks.prompt import PromptSuffix, ThinkNotOpened
from audit.checks.roundtrip import RoundTrip, TextMismatch
from audit.checks.segmentation import (
    ResponseTokenMissing,
    ResponseTokenRepeated,
    ThinkTokenInOutput,
    ToolCallInReasoning,
)
from audit.checks.template import TemplateMismatch
from audit.checks.termination import Aborted, EmptyOutput, EndOfTurnMissing, Truncated, TurnJoined
from audit.checks.tool_names import ToolNotDeclared
from audit.checks.toolcalls import (
    ToolArgumentPythonLiteral,
    ToolArgumentsInvalidJson,
    ToolCallIdMalformed,
    ToolMarkerGrammar,
)
from audit.checks.trainer import (
    TrainerArgumentsEmptied,
    TrainerHistoryTrained,
    TrainerIdsChanged,
    TrainerMaskChanged,
    TrainerMaxLength,
    TrainerNotViewed,
    TrainerReasoningDropped,
    TrainerRecordDropped,
    TrainerRoleOrder,
    TrainerSystemPrompt,
)
from audit.checks.xtml import XtmlChannelOrder, XtmlMarkerAsText

RULES: dict[str, type[Rule]] = {
    rule.code: rule
    for rule in (
        UnreadableLine,
        RecordContract,
        TokenOutOfVocabulary,
        DuplicateSampleId,
        MetaCountMismatch,
        PromptSuffix,
        ThinkNotOpened,
        TemplateMismatch,
        ResponseTokenMissing,
        ResponseTokenRepeated,
        ThinkTokenInOutput,
        ToolCallInReasoning,
        ChannelGrammar,
        ChannelOrder,
        ChannelToolCall,
        ChannelStrayText,
        XtmlChannelOrder,
        XtmlMarkerAsText,
        PlaceholderCount,
        PreExpandedPads,
        VisionSpanBroken,
        ImageUnreadable,
        ImageOutOfOrder,
        VisionTokenInOutput,
        ImageNotChecked,
        ToolMarkerGrammar,
        ToolArgumentsInvalidJson,
        ToolCallIdMalformed,
        ToolMarkerAsText,
        ToolArgumentPythonLiteral,
        ToolNotDeclared,
        RoundTrip,
        TextMismatch,
        Truncated,
        EndOfTurnMissing,
        Aborted,
        EmptyOutput,
        TurnJoined,
        RepetitionLoop,
        SegmentTooShort,
        ServingModeMissing,
        TrainerSystemPrompt,
        TrainerIdsChanged,
        TrainerMaskChanged,
        TrainerReasoningDropped,
        TrainerRoleOrder,
        TrainerMaxLength,
        TrainerArgumentsEmptied,
        TrainerRecordDropped,
        TrainerHistoryTrained,
        TrainerNotViewed,
        InternalError,
    )
}

__all__ = ["RULES", "Rule", "Severity"]
