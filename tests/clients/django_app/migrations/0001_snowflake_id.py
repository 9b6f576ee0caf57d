from django.db import migrations


class Migration(migrations.Migration):
    """Creates the extension before any table uses snowflake_nextval().
    Needs a superuser (the extension is untrusted), or create it beforehand."""

    dependencies = []

    operations = [
        migrations.RunSQL(
            "CREATE EXTENSION IF NOT EXISTS snowflake_id",
            reverse_sql=migrations.RunSQL.noop,
        ),
    ]
