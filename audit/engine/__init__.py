"""The engine: one rule set over blocks of lines, whatever their source, findings spilled to
disk in line order, a rule that raises isolated to the records it raises on."""
