"""Frontend: annotations (lark), tracing of @mf.kernel functions into a Graph, the Kernel."""
