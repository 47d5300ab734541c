"""The `audit inspect` viewer (textual) and a record's detail as rich text, also for `--print`."""
