package io.terrascale.spark.format;

import java.util.HashMap;
import java.util.List;
import java.util.Map;

/**
 * Where the wanted columns sit in a row of one schema version (docs/format/segment.md §1): after
 * the header, the null bitmap (a bit per column of the version), the fixed-width fields in
 * column order, then one u32 end offset per variable-width field and their bytes. Columns are
 * matched by id; a column the version lacks (added later, or retyped) reads as null.
 */
public final class RowLayout {
    final int vendOff; // offset of the variable fields' end offsets
    final int nvar;
    final int varArea; // offset of the variable fields' bytes
    final int[] pos; // per wanted column: its position in the version (its null bit), -1 if absent
    final int[] at; // per wanted column: its fixed offset in the row, or its variable slot

    RowLayout(Schema s, List<Column> want) {
        int nb = (s.columns().size() + 7) / 8;
        Map<Integer, Integer> fixedAt = new HashMap<>();
        Map<Integer, Integer> slot = new HashMap<>();
        int off = Segment.ROW_HEADER + nb;
        int v = 0;
        for (Column c : s.columns()) {
            if (c.kind().variable()) {
                slot.put(c.id(), v++);
            } else {
                fixedAt.put(c.id(), off);
                off += c.kind().width();
            }
        }
        vendOff = off;
        nvar = v;
        varArea = off + 4 * v;
        pos = new int[want.size()];
        at = new int[want.size()];
        for (int j = 0; j < want.size(); j++) {
            Column w = want.get(j);
            pos[j] = -1;
            for (int i = 0; i < s.columns().size(); i++) {
                Column c = s.columns().get(i);
                if (c.id() == w.id() && c.type().equals(w.type())) {
                    pos[j] = i;
                    at[j] = c.kind().variable() ? slot.get(c.id()) : fixedAt.get(c.id());
                }
            }
        }
    }
}
