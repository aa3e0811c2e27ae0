"""The conformance gate's tests: `pytest --pyargs conformance.gate [--chatgold-runner R ...]`."""
