import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parent))


@pytest.fixture
def rng() -> np.random.Generator:
    """Fresh random inputs every run; the seed is printed on failure by pytest's -ra summary via the id."""
    seed = np.random.SeedSequence().entropy % (2**32)
    print(f"rng seed {seed}")
    return np.random.default_rng(seed)
