"""Backend access: catalog reflection (`reflect`), the embedded PostgreSQL (`embedded_pg`), the
process's connection pool for remote leaves (`pool`), COPY into Arrow (`copy_arrow`) and the
backend's cost estimates (`estimates`)."""
