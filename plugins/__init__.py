"""runstore's built-in backend plugins; each is loaded through the ``runstore`` entry points."""
