"""What ``postgresql+mtcache`` supports, for SQLAlchemy's compliance suite. The suite's defaults
(`SuiteRequirements`) close what not every database has; the dialect is PostgreSQL's, so what
PostgreSQL 15 has is opened (`POSTGRESQL`). What stays closed, each with its reason, is below;
a closed requirement skips its tests."""

from sqlalchemy.testing import exclusions
from sqlalchemy.testing.requirements import SuiteRequirements

POSTGRESQL = (
    "aggregate_order_by",
    "array_type",
    "autocommit",
    "boolean_col_expressions",
    "check_constraint_reflection",
    "column_collation_reflection",
    "comment_reflection",
    "comment_reflection_full_unicode",
    "computed_columns_stored",
    "constraint_comment_reflection",
    "create_or_replace_view",
    "create_table_as",
    "create_temp_table_as",
    "cross_schema_fk_reflection",
    "ctes",
    "ctes_on_dml",
    "ctes_with_update_delete",
    "ctes_with_values",
    "date_historic",
    "datetime_historic",
    "datetime_interval",
    "datetime_literals",
    "datetime_timezone",
    "datetime_timezone_historic",
    "default_schema_name_switch",
    "deferrable_fks",
    "delete_from",
    "except_",
    "expression_server_defaults",
    "fetch_expression",
    "fetch_first",
    "fetch_no_order_by",
    "fetch_offset_with_options",
    "fetch_ties",
    "fk_constraint_option_reflection_ondelete_noaction",
    "fk_constraint_option_reflection_ondelete_restrict",
    "fk_constraint_option_reflection_onupdate_restrict",
    "float_or_double_precision_behaves_generically",
    "foreign_key_constraint_option_reflection_ondelete",
    "foreign_key_constraint_option_reflection_onupdate",
    "has_temp_table",
    "identity_columns",
    "identity_columns_standard",
    "implicit_default_schema",
    "index_ddl_if_exists",
    "index_reflects_included_columns",
    "indexes_check_column_order",
    "indexes_with_expressions",
    "infinity_floats",
    "inline_check_constraint_reflection",
    "intersect",
    "isolation_level",
    "json_type",
    "materialized_views",
    "mod_operator_as_percent_sign",
    "non_updating_cascade",
    "nullsordering",
    "order_by_label_with_expression",
    "percent_schema_names",
    "precision_numerics_enotation_small",
    "precision_numerics_many_significant_digits",
    "reflect_indexes_with_expressions",
    "reflect_table_options",
    "reflect_tables_no_columns",
    "reflects_pk_names",
    "regexp_match",
    "regexp_replace",
    "repeated_column_foreign_keys",
    "savepoints",
    "schema_create_delete",
    "server_defaults",
    "skip_autocommit_rollback",
    "supports_bitwise_and",
    "supports_bitwise_not",
    "supports_bitwise_or",
    "supports_bitwise_shift",
    "supports_bitwise_xor",
    "supports_distinct_on",
    "table_ddl_if_exists",
    "table_value_constructor",
    "temp_table_comment_reflection",
    "temp_table_names",
    "temporary_views",
    "time_timezone",
    "timestamp_microseconds",
    "tuple_in",
    "unicode_ddl",
    "unique_constraints_reflect_as_index",
    "update_from",
    "uuid_data_type",
    "views",
    "window_functions",
    "window_range",
    "window_range_non_numeric",
    "window_range_numeric",
)


class Requirements(SuiteRequirements):
    """Closed by the suite's defaults and left closed:

    - async_dialect: the cache offers no asyncio DB-API (docs/limits.md);
    - two_phase_transactions: the DB-API has no tpc_* methods;
    - dbapi_lastrowid, emulated_lastrowid_even_with_sequences: PostgreSQL has no lastrowid
      (RETURNING gives keys);
    - fetch_percent, nvarchar_types, foreign_keys_reflect_as_index,
      unique_index_reflect_as_unique_constraints, materialized_views_reflect_pk,
      repeated_remote_col_foreign_keys: PostgreSQL has none of these;
    - computed_columns, computed_columns_default_persisted, computed_columns_virtual:
      PostgreSQL 15 has only STORED generated columns (computed_columns_stored is open);
    - reflect_indexes_with_ascdesc_as_expression: PostgreSQL reflects ASC/DESC as column
      sorting, not as expressions;
    - json_deserializer_binary: psycopg hands the deserializer text.
    """


for _name in POSTGRESQL:
    setattr(Requirements, _name, property(lambda self: exclusions.open()))
