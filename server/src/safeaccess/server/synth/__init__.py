"""Synthetic data from noisy marginals (server synth worker; needs the `synth` extra).

`fit.py` imports JAX and Private-PGM (`mbi`): import it in the synth worker process only, never
in the API process.
"""
