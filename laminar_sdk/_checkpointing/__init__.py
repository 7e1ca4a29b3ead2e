"""Checkpoint stores: the manifest, the :class:`Checkpointer` contract and its backends.

Everything here is internal; the public names are exported from :mod:`laminar_sdk`.
"""
