"""How trials run: local worker processes (default); Ray and Slurm executors plug in here."""
