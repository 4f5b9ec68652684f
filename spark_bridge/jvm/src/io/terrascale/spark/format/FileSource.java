package io.terrascale.spark.format;

import java.io.IOException;
import java.io.RandomAccessFile;

/** An object of a local object store ({@code trfs://}): a file read by ranges. */
public final class FileSource implements ByteSource {
    private final RandomAccessFile f;

    public FileSource(String path) throws IOException {
        f = new RandomAccessFile(path, "r");
    }

    @Override
    public byte[] read(long offset, int length) throws IOException {
        byte[] out = new byte[length];
        f.seek(offset);
        f.readFully(out);
        return out;
    }

    @Override
    public void close() throws IOException {
        f.close();
    }
}
