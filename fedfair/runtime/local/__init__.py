"""A whole federation on one machine: its files (workspace), its processes, and ``fedfair launch``'s run."""
