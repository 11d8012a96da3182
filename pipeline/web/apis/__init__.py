"""The wire formats over the one request runner: AUTOMATIC1111's ``/sdapi/v1``, OpenAI's ``/v1/images``, MCP's tool."""
