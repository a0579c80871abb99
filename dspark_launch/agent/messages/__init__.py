"""The agent protocol's messages, one module per handler subject. `protocol` re-exports them as
`protocol.Name` and imports a module on first use (an agent only its operation's); its registry pairs each request
with its answer and handler."""
