"""Home of later work (see docs/design.md, 'Layout'); nothing here yet."""
