"""The record view: blocks of lines read into records (strictly, against the input contract),
and what rules read of a record, computed once per batch: where reasoning ends, the tool calls,
the harmony messages, each token's segment."""
