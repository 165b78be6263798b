"""The character-level GPT example; its code is `hpo/examples/char_gpt.py` (installed with the package).

This name keeps `from examples.char_gpt import workload` working from a checkout.
"""

from hpo.examples.char_gpt import *  # noqa: F401,F403
