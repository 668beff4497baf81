"""TPC-D (TPC-H) experiments of the dissertation."""
