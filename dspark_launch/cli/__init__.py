"""The Typer command line: parse options, call the layers, render tables or JSON."""
