"""The torch-free part: target families, taps, sizes, the memory plan, preflight and parity checks."""
