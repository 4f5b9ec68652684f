package io.terrascale.spark.node;

import java.io.Serializable;

/** A node's HTTP address ({@code http(s)://HOST:PORT}), its bearer token (or null) and the timeout of each call. */
public record Endpoint(String url, String token, double timeoutS) implements Serializable {
    @Override
    public String toString() {
        return "Endpoint[" + url + "]"; // never the token: this may end up in a log or an error
    }
}
