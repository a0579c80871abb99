"""The node agent's operations, one module per subject; registered in `agent.protocol.OPERATIONS`."""
