"""The pure protocol core: request rules, wire surfaces, retry classification, poll schedule and
the operations as flows. Nothing here performs I/O or sleeps."""
