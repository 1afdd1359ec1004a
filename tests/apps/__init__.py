"""Application modules with @pgsched.job handlers, imported by schedulers and workers in the tests."""
