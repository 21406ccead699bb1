"""Small third-party plugins, one per behaviour the hook contract promises.

Each module is a plugin as a third party would ship it: hook implementations marked with
`reame_core.hookimpl`, found through a ``reame`` entry point. The tests install only the
ones they need (see the `install_plugins` fixture) and read what a plugin recorded from
its module.
"""
