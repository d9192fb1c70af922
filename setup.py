"""Package discovery (the rest of the metadata is in pyproject.toml).

Every package under ``specframe/`` ships, found rather than listed by hand, and the repository's ``plugins/`` ships as
``specframe_plugins`` (with its subpackages): a wheel never holds a top-level ``plugins``, ``contrib`` or ``tests``
package. pyproject.toml's ``[tool.setuptools.packages.find]`` cannot rename a folder, hence this file.
"""

from setuptools import find_packages, setup

PLUGINS_DIR, PLUGINS_PACKAGE = "plugins", "specframe_plugins"

core = find_packages(include=["specframe", "specframe.*"])
plugins = [PLUGINS_PACKAGE + name[len(PLUGINS_DIR):] for name in find_packages(include=[PLUGINS_DIR, PLUGINS_DIR + ".*"])]

# folders of data only (no __init__.py) that Python can still import as namespace packages: listed, so setuptools
# ships their package data (pyproject.toml) instead of warning that they are "absent from packages"
data = ["specframe.testing.traces"]

setup(packages=core + plugins + data, package_dir={"specframe": "specframe", PLUGINS_PACKAGE: PLUGINS_DIR})
