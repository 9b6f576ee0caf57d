import java.sql.Connection;
import java.sql.PreparedStatement;
import java.sql.ResultSet;
import java.sql.SQLException;

/**
 * Snowflake IDs prefetched in blocks, as Leaf's segment mode does: one round
 * trip (SELECT snowflake_nextvals(n)) fetches n IDs, and next() hands them
 * out locally. A block's IDs are increasing, and each block of a session is
 * above the one before. Thread-safe; the connection is used only to refill.
 * IDs never handed out (the process stops) are skipped, as with a sequence's
 * cache. An ID records when its block was fetched, not when it was used.
 */
public final class SnowflakeIds {
    private final Connection conn;
    private final int blockSize;
    private long[] block = new long[0];
    private int next;

    public SnowflakeIds(Connection conn, int blockSize) {
        if (blockSize < 1 || blockSize > 1_000_000) {
            throw new IllegalArgumentException("blockSize must be 1 to 1,000,000");
        }
        this.conn = conn;
        this.blockSize = blockSize;
    }

    public synchronized long next() throws SQLException {
        if (next == block.length) {
            block = fetchBlock();
            next = 0;
        }
        return block[next++];
    }

    private long[] fetchBlock() throws SQLException {
        long[] ids = new long[blockSize];
        int n = 0;
        try (PreparedStatement ps = conn.prepareStatement("SELECT snowflake_nextvals(?)")) {
            ps.setInt(1, blockSize);
            try (ResultSet rs = ps.executeQuery()) {
                while (rs.next() && n < blockSize) {
                    ids[n++] = rs.getLong(1);
                }
            }
        }
        if (n != blockSize) {
            throw new SQLException("snowflake_nextvals(" + blockSize + ") returned " + n + " IDs");
        }
        return ids;
    }
}
