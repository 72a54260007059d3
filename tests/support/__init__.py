"""Test support shared by every tier: polling (wait.py), the operator as a subprocess (operator_process.py) and a
local cluster that is taken down whatever happens (cluster.py).

Importable as `support` from any test: pyproject.toml's [tool.pytest.ini_options] puts tests/ on sys.path.
"""
