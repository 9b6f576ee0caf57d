import java.sql.Connection;
import java.sql.PreparedStatement;
import java.sql.ResultSet;
import java.sql.SQLException;
import java.sql.Statement;
import java.util.ArrayList;
import java.util.List;

/**
 * Rows keyed by the column default snowflake_nextval(): the database makes
 * the key, and the INSERT returns it in the same round trip.
 */
public final class Orders {
    private Orders() {
    }

    /** INSERT ... RETURNING id: the key as a result set. */
    public static long insertReturning(Connection conn, String item) throws SQLException {
        try (PreparedStatement ps = conn.prepareStatement(
                "INSERT INTO orders (item) VALUES (?) RETURNING id")) {
            ps.setString(1, item);
            try (ResultSet rs = ps.executeQuery()) {
                rs.next();
                return rs.getLong(1);
            }
        }
    }

    /** The JDBC way: pgjdbc appends RETURNING * and getGeneratedKeys() reads it. */
    public static long insertWithGeneratedKey(Connection conn, String item) throws SQLException {
        try (PreparedStatement ps = conn.prepareStatement(
                "INSERT INTO orders (item) VALUES (?)", Statement.RETURN_GENERATED_KEYS)) {
            ps.setString(1, item);
            ps.executeUpdate();
            try (ResultSet keys = ps.getGeneratedKeys()) {
                keys.next();
                return keys.getLong("id");
            }
        }
    }

    /**
     * A batch, every row's key returned in the order of the rows. Naming the
     * key column makes it RETURNING "id" (not RETURNING *). pgjdbc 42.5 sends
     * one INSERT per row for a batch that returns keys, even with
     * reWriteBatchedInserts=true (pgjdbc issue 3683).
     */
    public static List<Long> insertBatch(Connection conn, List<String> items) throws SQLException {
        List<Long> ids = new ArrayList<>(items.size());
        try (PreparedStatement ps = conn.prepareStatement(
                "INSERT INTO orders (item) VALUES (?)", new String[] {"id"})) {
            for (String item : items) {
                ps.setString(1, item);
                ps.addBatch();
            }
            ps.executeBatch();
            try (ResultSet keys = ps.getGeneratedKeys()) {
                while (keys.next()) {
                    ids.add(keys.getLong(1));
                }
            }
        }
        return ids;
    }

    /** Many rows in one statement from arrays, the keys returned in the order of the rows. */
    public static List<Long> insertAll(Connection conn, List<String> items) throws SQLException {
        List<Long> ids = new ArrayList<>(items.size());
        try (PreparedStatement ps = conn.prepareStatement(
                "INSERT INTO orders (item) SELECT * FROM unnest(?::text[]) RETURNING id")) {
            ps.setArray(1, conn.createArrayOf("text", items.toArray()));
            try (ResultSet rs = ps.executeQuery()) {
                while (rs.next()) {
                    ids.add(rs.getLong(1));
                }
            }
        }
        return ids;
    }

    /**
     * Keys from prefetched blocks (SnowflakeIds), set by the client: nothing
     * to return, so reWriteBatchedInserts=true sends multi-row INSERTs.
     */
    public static List<Long> insertBatchWithIds(Connection conn, SnowflakeIds snowflakeIds,
                                                List<String> items) throws SQLException {
        List<Long> ids = new ArrayList<>(items.size());
        try (PreparedStatement ps = conn.prepareStatement(
                "INSERT INTO orders (id, item) VALUES (?, ?)")) {
            for (String item : items) {
                long id = snowflakeIds.next();
                ps.setLong(1, id);
                ps.setString(2, item);
                ps.addBatch();
                ids.add(id);
            }
            ps.executeBatch();
        }
        return ids;
    }
}
