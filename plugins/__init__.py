"""specframe's built-in plugins, installed as the ``specframe_plugins`` package.

Each module is one plugin and is registered through the ``specframe`` entry-point group exactly as a
third-party plugin would be; the core never imports these modules by name.
"""
