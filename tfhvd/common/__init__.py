"""Framework-neutral pieces: the compiled library, lifecycle, topology, errors."""
