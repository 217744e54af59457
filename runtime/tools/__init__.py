"""Tools: declaration from typed functions, workspace tools with path safety, the code sandbox, extensions."""
