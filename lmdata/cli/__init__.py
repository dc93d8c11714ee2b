"""The command-line interface: one thin module per verb (parse, call the library, report)."""
