package io.terrascale.spark.format;

import java.io.IOException;

/** Where an object's bytes come from: a local file, or an HTTP(S) URL (node.UrlSource). */
public interface ByteSource extends AutoCloseable {
    /** Exactly {@code length} bytes at {@code offset}, or an IOException. */
    byte[] read(long offset, int length) throws IOException;

    @Override
    void close() throws IOException;
}
