package io.terrascale.spark.node;

import io.terrascale.spark.format.ByteSource;
import java.io.IOException;
import java.io.InputStream;
import java.io.InterruptedIOException;
import java.net.URI;
import java.net.http.HttpRequest;
import java.net.http.HttpResponse;
import java.nio.charset.StandardCharsets;

/** An object read through a presigned GET URL from the plan (S3: executors need no SDK or credentials). */
public final class UrlSource implements ByteSource {
    private final URI url;
    private final Retry retry;

    public UrlSource(String url) {
        this(url, Retry.SYSTEM);
    }

    UrlSource(String url, Retry retry) {
        this.url = URI.create(url);
        this.retry = retry;
    }

    /** A 4xx: the store refused the request (an expired URL, say), and would refuse it again. */
    static final class Refused extends IOException {
        private static final long serialVersionUID = 1L;

        Refused(String message) {
            super(message);
        }
    }

    @Override
    public byte[] read(long offset, int length) throws IOException {
        HttpRequest req = HttpRequest.newBuilder(url).header("Range", "bytes=" + offset + "-" + (offset + length - 1)).GET().build();
        // a ranged GET is a read: a transport failure, a 5xx (S3's 500 InternalError, 503 SlowDown) or a short
        // body may be retried; a 4xx would only be refused again
        return retry.call(NodeClient.READ, () -> get(req, offset, length), e -> e instanceof IOException && !(e instanceof Refused));
    }

    private byte[] get(HttpRequest req, long offset, int length) throws IOException {
        HttpResponse<InputStream> r;
        try {
            r = Http.client().send(req, HttpResponse.BodyHandlers.ofInputStream());
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
            InterruptedIOException out = new InterruptedIOException("interrupted reading " + url.getPath());
            out.initCause(e);
            throw out;
        }
        try (InputStream in = r.body()) {
            int st = r.statusCode();
            if (st != 206 && st != 200) {
                String text = new String(in.readNBytes(300), StandardCharsets.UTF_8);
                String msg = "GET " + url.getPath() + " bytes " + offset + "+" + length + ": HTTP " + st + " " + text;
                throw st >= 500 ? new IOException(msg) : new Refused(msg);
            }
            byte[] out = in.readAllBytes();
            if (out.length != length) {
                throw new IOException("short ranged read of " + url.getPath() + ": " + out.length + " of " + length + " bytes");
            }
            return out;
        }
    }

    @Override
    public void close() {}
}
