"""runstore's conformance suite: the tests every backend, ours or a third party's, must pass.

Run it with ``pytest --pyargs runstore.conformance --runstore-backend URL`` or
``runstore check URL``. Importing this package is cheap; the suite modules import
pytest and hypothesis.
"""
