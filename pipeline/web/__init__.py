"""The Gradio side: the handler, the Blocks page, routes, lifecycle, and Gradio internals (one module)."""
