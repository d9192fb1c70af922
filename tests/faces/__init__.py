"""What users run: the Python API, config files and the CLI, input files, output encoding, the OpenAI server, the
stepping API, the vLLM adapter, and the configs the docs ship."""
