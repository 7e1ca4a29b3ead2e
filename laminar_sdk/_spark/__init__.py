"""The Spark bridge's implementation; its public names are in :mod:`laminar_sdk.spark`.

``pyspark`` is imported here and in ``pyspark_laminar`` only.
"""
