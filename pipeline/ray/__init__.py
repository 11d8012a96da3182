"""Past one GPU: Ray Serve replicas, each with the same gate. Imported only where the backend is chosen."""
