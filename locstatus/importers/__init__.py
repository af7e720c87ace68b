"""Importers: take over the pause/resume state another system holds, through the manager.

- :mod:`.backbeat`: ``locstatus import backbeat`` (ZooKeeper state nodes, MongoDB
  ``__locationStatusStore``; docs/backbeat.md);
- :mod:`.command`: the ``locstatus import`` command group (typer), registered by the CLI.
"""
