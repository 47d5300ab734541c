"""`audit inspect`: look at the records with findings token by token.

`model` builds the view of a record as data (no terminal code); `render` turns it into rich
text for `--print`; `app` is the interactive textual viewer.
"""

from audit.inspect.model import Inspector, RecordEntry, RecordView

__all__ = ["Inspector", "RecordEntry", "RecordView"]
