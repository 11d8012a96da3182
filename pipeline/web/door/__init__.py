"""The front door: who is asking, what they may send, and at what rate, before Gradio or a route reads it."""
