"""The ``terrascale`` Python data source (pyspark.sql.datasource, pyspark >= 4.0).

Spark calls :meth:`TerrascaleDataSource.schema` once, at ``load()``, and pickles the data
source right after — so the snapshot pinned there (T and the schema at T) is the one every
later planning step of that DataFrame sees: the columns Spark was promised and the rows the
reader returns are of the same T by construction.
"""
from __future__ import annotations

from pyspark.sql.datasource import DataSource
from pyspark.sql.types import StructType

from rowstore.schema import SchemaVersion
from spark_bridge.changes import FEED_FIELDS, ChangeFeedStream, ChangesReader, check_feed_columns
from spark_bridge.errors import BridgeError, OptionError
from spark_bridge.options import Options
from spark_bridge.reader import TerrascaleReader
from spark_bridge.remote import Remote
from spark_bridge.types import select_columns, spark_schema
from spark_bridge.writer import TerrascaleWriter


class TerrascaleDataSource(DataSource):
    pinned: tuple[int, str] | None = None  # (T, schema JSON at T), set by schema()

    @classmethod
    def name(cls) -> str:
        return "terrascale"

    def _opts(self) -> Options:
        opts = Options.parse(self.options)
        if opts.reader == "jvm":
            raise OptionError("option reader: the JVM reader is not on this session's classpath (its jar "
                              "spark_bridge/jvm/build/terrascale-spark.jar is built by `make jvm`; "
                              "spark_bridge.session.local_session() adds it), so the Python reader serves this read")
        if opts.change_feed and (opts.where or opts.bbox or opts.sealed_only):
            raise OptionError("options where, bbox and sealed_only do not apply to the change feed")
        return opts

    def schema(self) -> StructType:
        opts = self._opts()
        with Remote(opts) as r:
            snap = r.snapshot(opts.as_of)
        self.pinned = (snap["as_of"], snap["schema"])
        table = SchemaVersion.from_json(snap["schema"])
        columns = select_columns(table, opts.columns, f"table {opts.table!r}")
        if opts.change_feed:
            check_feed_columns(table, opts.table)
            return spark_schema(table, FEED_FIELDS, columns)
        return spark_schema(table, columns=columns)

    def reader(self, schema: StructType):
        opts = self._opts()
        T, text = self.pinned if self.pinned is not None else (None, None)  # None: .schema(...) was given
        if opts.change_feed:
            if T is None:
                raise BridgeError("the change feed's schema comes from the table; do not pass .schema(...)")
            return ChangesReader(opts, schema, T, text)
        if T is None:
            with Remote(opts) as r:
                snap = r.snapshot(opts.as_of)
            T, text = snap["as_of"], snap["schema"]
            table = SchemaVersion.from_json(text)
            if spark_schema(table, columns=select_columns(table, opts.columns, f"table {opts.table!r}")) != schema:
                raise BridgeError(f"the schema given with .schema(...) is not table {opts.table!r}'s schema at {T}; "
                                  f"leave it out (the bridge derives it)")
        return TerrascaleReader(opts, schema, T, text)

    def streamReader(self, schema: StructType):
        opts = self._opts()
        if not opts.change_feed:
            raise BridgeError("a streaming read of a Terrascale table is its change feed: add "
                              ".option('change_feed', 'true') (the rows then carry commit_ts and op)")
        if self.pinned is None:
            raise BridgeError("the change feed's schema comes from the table; do not pass .schema(...)")
        return ChangeFeedStream(opts, schema, self.pinned[1])

    def writer(self, schema: StructType, overwrite: bool):
        opts = self._opts()
        if overwrite:
            raise BridgeError("mode('overwrite') is not supported by terrascale: writes upsert rows by primary key; "
                              "use mode('append') (a row whose key exists replaces it)")
        if opts.change_feed or opts.as_of is not None:
            raise OptionError("options change_feed and as_of are for reads; a write goes to the table now")
        return TerrascaleWriter(opts, schema)


class PythonReaderSource(TerrascaleDataSource):
    """The same source under ``terrascale_python``: where the JVM reader serves ``terrascale``, it
    hands this one writes, the change feed and ``option("reader", "python")``."""

    @classmethod
    def name(cls) -> str:
        return "terrascale_python"
