"""PyTorch is optional: ``import hpcopt`` never loads it, and ``hpcopt.torch`` without it says
how to install it (both checked whether or not torch is installed)."""

import subprocess
import sys


def run(code: str) -> str:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True).stdout.strip()


def test_importing_hpcopt_does_not_load_torch():
    assert run("import sys, hpcopt, hpcopt.flat, hpcopt.build; print('torch' in sys.modules)") == "False"


def test_hpcopt_torch_without_torch_names_the_extra():
    code = ("import sys\nsys.modules['torch'] = None  # as if not installed\n"
            "try:\n    import hpcopt.torch\nexcept ImportError as exc:\n    print(exc)")
    assert "pip install 'hpcopt[torch]'" in run(code)
