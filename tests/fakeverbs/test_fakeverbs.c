#include <criterion/criterion.h>
Test(fakeverbs, placeholder)
{
}
