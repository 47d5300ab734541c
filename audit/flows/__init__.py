"""Flows: a command's work without the command. What to audit with (the session), a check from
cache, engine or workers, the gate's split, a live watch, the data a viewer shows."""
