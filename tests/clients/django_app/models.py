from django.db import models


class SnowflakeNextval(models.Func):
    """The column default snowflake_nextval(); Django reads the new key back
    with INSERT ... RETURNING, in the same round trip."""

    function = "snowflake_nextval"
    template = "%(function)s()"
    output_field = models.BigIntegerField()


class SnowflakeModel(models.Model):
    """Base class for models keyed by snowflake IDs (Django has no
    project-wide setting for this: DEFAULT_AUTO_FIELD must be an AutoField)."""

    id = models.BigIntegerField(primary_key=True, db_default=SnowflakeNextval(), editable=False)

    class Meta:
        abstract = True


class Customer(SnowflakeModel):
    name = models.CharField(max_length=100, unique=True)


class Order(SnowflakeModel):
    customer = models.ForeignKey(Customer, on_delete=models.CASCADE)
    item = models.CharField(max_length=100)
